"""Faults under traffic: Redis killed and restarted, clients that go away mid-stream."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
import pytest

from kvgate.testing import wait_until
from kvgate.testing_redis import RedisServer, find_redis_server

from .conftest import fake_fleet

pytestmark = pytest.mark.usefixtures("both_servers")


async def test_redis_killed_and_restarted_under_traffic_fails_no_request() -> None:
    if find_redis_server() is None:
        pytest.skip("redis-server not installed")
    with RedisServer() as redis:
        overrides = {"store": {"url": redis.url}}
        async with fake_fleet(2, **overrides) as (gw, _), aiohttp.ClientSession() as session:
            statuses: Counter[int] = Counter()
            stop = asyncio.Event()

            async def traffic(n: int) -> None:
                i = 0
                while not stop.is_set():
                    i += 1
                    body = {"model": "demo", "prompt": f"turn {i}"}
                    headers = {"X-Session-ID": f"user-{n}-{i % 5}"}
                    async with session.post(
                        gw.openai_base + "/completions", json=body, headers=headers
                    ) as resp:
                        await resp.read()
                        statuses[resp.status] += 1

            store = gw.gateway.store
            tasks = [asyncio.create_task(traffic(n)) for n in range(4)]
            try:
                await wait_until(lambda: sum(statuses.values()) >= 20, message="traffic")
                redis.stop()
                await wait_until(lambda: store.health().degraded, message="degraded")  # type: ignore[attr-defined]
                during = sum(statuses.values())
                await wait_until(lambda: sum(statuses.values()) >= during + 20, message="served")
                redis.start()
                await wait_until(
                    lambda: not store.health().degraded,  # type: ignore[attr-defined]
                    timeout=15,
                    message="recovered",
                )
                after = sum(statuses.values())
                await wait_until(lambda: sum(statuses.values()) >= after + 40, message="more")
            finally:
                stop.set()
                await asyncio.gather(*tasks)
            health = store.health()  # type: ignore[attr-defined]
            assert set(statuses) == {200}, statuses
            assert (health.degraded_total, health.resyncs_total) == (1, 1)
            async with session.get(gw.url + "/metrics") as resp:
                text = await resp.text()
            assert "kvgate_store_degraded 0.0" in text
            assert "kvgate_store_degraded_episodes_total 1.0" in text


async def test_a_client_gone_mid_stream_releases_its_worker() -> None:
    async with fake_fleet(1) as (gw, (fake,)), aiohttp.ClientSession() as session:
        body = {"model": "demo", "prompt": "mode:slow_stream", "stream": True}
        resp = await session.post(gw.openai_base + "/completions", json=body)
        assert fake.streaming == 1
        assert (await resp.content.readline()).startswith(b"data:")
        (worker,) = list(gw.gateway.pool)
        assert worker.in_flight == 1
        resp.close()  # the client goes away mid-stream
        await wait_until(lambda: worker.in_flight == 0, message="the slot released")
        await wait_until(lambda: gw.gateway.proxy.in_flight == 0, message="the request ended")
        # The worker's connection was dropped, so it stops generating.
        await wait_until(lambda: fake.streaming == 0, message="the worker saw the client go")
        async with session.get(gw.url + "/metrics") as metrics:
            assert "kvgate_client_disconnects_total" in await metrics.text()


async def test_a_client_that_hangs_up_at_done_was_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP clients close once they read ``[DONE]``, often before the stream's last chunk.

    Such a client had the whole answer: it is no disconnect (no 499), and the usage the
    worker sent still reaches the policy (the cache feedback, the queue estimate)."""
    async with fake_fleet(1) as (gw, (fake,)), aiohttp.ClientSession() as session:
        usage: list[tuple[int, int, int]] = []
        policy = gw.gateway.policy
        on_usage = policy.on_usage

        def spy(request: Any, worker: Any, prompt: int, cached: int, now: float, **kw: Any) -> None:
            usage.append((prompt, cached, kw.get("completion_tokens", 0)))
            on_usage(request, worker, prompt, cached, now, **kw)

        monkeypatch.setattr(policy, "on_usage", spy)
        body = {"model": "demo", "prompt": "mode:linger_stream", "stream": True}
        resp = await session.post(gw.openai_base + "/completions", json=body)
        assert resp.status == 200
        lines = []
        while not lines or lines[-1] != b"data: [DONE]":
            lines.append((await asyncio.wait_for(resp.content.readline(), 10.0)).strip())
        resp.close()  # at [DONE]; the worker has not ended its stream yet
        await wait_until(lambda: gw.gateway.proxy.in_flight == 0, message="the request ended")
        fake.linger.set()
        assert usage == [(300, 100, 5)]
        async with session.get(gw.url + "/metrics") as metrics:
            text = await metrics.text()
        assert 'kvgate_client_disconnects_total{model="demo"}' not in text


async def test_every_attempt_that_reports_no_usage_is_dropped_from_the_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed attempt (the worker's 500) and a client gone mid-stream both end with the
    policy told (``on_dropped``): else what it queued for them stays owed there."""
    async with fake_fleet(1) as (gw, _), aiohttp.ClientSession() as session:
        dropped: list[str] = []
        policy = gw.gateway.policy
        on_dropped = policy.on_dropped

        def spy(request: Any, worker: Any, now: float) -> None:
            dropped.append(request.request_id)
            on_dropped(request, worker, now)

        monkeypatch.setattr(policy, "on_dropped", spy)
        async with session.post(
            gw.openai_base + "/completions", json={"model": "demo", "prompt": "mode:poison"}
        ) as resp:
            assert resp.status >= 500
            failed = resp.headers["X-Request-ID"]
        assert dropped == [failed]
        body = {"model": "demo", "prompt": "mode:slow_stream", "stream": True}
        resp = await session.post(gw.openai_base + "/completions", json=body)
        assert (await resp.content.readline()).startswith(b"data:")
        gone = resp.headers["X-Request-ID"]
        resp.close()
        await wait_until(lambda: gw.gateway.proxy.in_flight == 0, message="the request ended")
        assert dropped == [failed, gone]
