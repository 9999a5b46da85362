"""The KV headroom gate live: the gateway counts what it sends and holds what would not fit."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from kvgate.core.fleet import Pressure
from kvgate.gateway.observe.scrape import parse_worker_metrics
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import wait_until

from .pressure_fleet import CAPACITY, pressure_config, pressure_fleet

# 0.7 of the cache each, estimated at 0.875 (5 characters a token, counted as 4): one fits
# under the hard mark, two do not.
PROMPT = "abcd " * round(0.7 * CAPACITY)
BODY = {"model": "demo", "prompt": PROMPT, "max_tokens": 8}
DEMAND = len(PROMPT) // 4 + 8


# Another prompt of the same size, sent critical: new work a wholly pressured fleet
# lets through, which shares none of the first's KV.
OTHER = {**BODY, "prompt": "efgh " * round(0.7 * CAPACITY)}


async def _send(
    session: aiohttp.ClientSession,
    gw: GatewayHandle,
    body: dict[str, Any] = BODY,
    headers: dict[str, str] | None = None,
) -> int:
    async with session.post(gw.openai_base + "/completions", json=body, headers=headers) as resp:
        await resp.read()
        return resp.status


async def _scraped_capacity(gw: GatewayHandle) -> None:
    (worker,) = list(gw.gateway.pool)
    await _scraped_capacity_of(gw, worker.id)


async def _scraped_capacity_of(gw: GatewayHandle, worker_id: str) -> None:
    worker = gw.gateway.pool.get(worker_id)
    assert worker is not None
    await wait_until(
        lambda: (
            worker.signals is not None
            and getattr(worker.signals, "kv_capacity_tokens", None) == CAPACITY
        ),
        message="a scrape with the cache size",
    )


def test_the_cache_size_is_read_from_vllm_cache_config_info() -> None:
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="400"} 1.0\n'
        "vllm:kv_cache_usage_perc 0.5\n"
    )
    signals = parse_worker_metrics(text)
    assert (signals.kv_capacity_tokens, signals.kv_usage) == (6400, 0.5)
    assert parse_worker_metrics("vllm:kv_cache_usage_perc 0.5\n").kv_capacity_tokens is None


async def test_a_request_that_would_overfill_its_worker_waits_for_headroom() -> None:
    async with (
        pressure_fleet(1) as (a,),
        running_gateway(pressure_config([a])) as gw,
        aiohttp.ClientSession() as session,
    ):
        await _scraped_capacity(gw)
        pool, router = gw.gateway.pool, gw.gateway.router
        worker = pool.get(a.url)
        assert worker is not None
        first = asyncio.create_task(_send(session, gw))
        await wait_until(lambda: worker.in_flight == 1, message="the first in flight")
        assert worker.kv_in_flight_tokens == DEMAND
        # Counted before any scrape shows it: past the soft mark, no new sessions.
        state = pool.snapshot("demo", 0.0, 0.0).get(a.url)
        assert state is not None and state.pressure is Pressure.SOFT
        # (The same prompt again would share the first's blocks in flight and fit.)
        second = asyncio.create_task(_send(session, gw, OTHER, {"X-Priority": "critical"}))
        await wait_until(lambda: router.kv_holds == 1, message="the second held")
        assert worker.in_flight == 1  # held at the gateway, not sent
        assert [await first, await second] == [200, 200]
        assert (worker.in_flight, worker.kv_in_flight_tokens) == (0, 0)
    assert a.engine.stats(0.0).preemptions == 0


async def test_without_pressure_handling_nothing_is_held() -> None:
    config: dict[str, Any] = {"pressure": {"enabled": False}}
    async with (
        pressure_fleet(1) as (a,),
        running_gateway(pressure_config([a], **config)) as gw,
        aiohttp.ClientSession() as session,
    ):
        await _scraped_capacity(gw)
        worker = gw.gateway.pool.get(a.url)
        assert worker is not None
        sends = [asyncio.create_task(_send(session, gw)) for _ in range(2)]
        await wait_until(lambda: worker.in_flight == 2, message="both sent at once")
        assert await asyncio.gather(*sends) == [200, 200]
        assert gw.gateway.router.kv_holds == 0


async def test_long_output_limits_do_not_mark_workers_pressured() -> None:
    """One open stream per worker with max_tokens at 90% of the cache: no shedding."""
    async with pressure_fleet(2) as fleet, aiohttp.ClientSession() as session:
        config = pressure_config(fleet)
        async with running_gateway(config) as gw:
            await wait_until(
                lambda: all(
                    w.signals is not None and w.signals.kv_capacity_tokens == CAPACITY
                    for w in gw.gateway.pool
                ),
                message="scrapes with the cache size",
            )
            greedy = {
                "model": "demo",
                "prompt": "hi",
                "max_tokens": int(0.9 * CAPACITY),
                "stream": True,
            }
            url = gw.openai_base + "/completions"
            streams = [await session.post(url, json=greedy) for _ in range(2)]
            try:
                for stream in streams:
                    assert stream.status == 200
                pool = gw.gateway.pool
                await wait_until(
                    lambda: sum(w.in_flight for w in pool) == 2, message="both streams open"
                )
                for worker in pool:
                    state = pool.snapshot("demo", 0.0, 0.0).get(worker.id)
                    assert state is not None and state.pressure is Pressure.NORMAL
                statuses = []
                for i in range(6):
                    body = {"model": "demo", "prompt": f"new session {i}", "max_tokens": 2}
                    headers = {"X-Session-ID": f"s{i}"}
                    async with session.post(url, json=body, headers=headers) as resp:
                        await resp.read()
                        statuses.append(resp.status)
                assert statuses == [200] * 6
            finally:
                for stream in streams:
                    stream.close()


async def test_a_bound_session_with_nothing_cached_at_its_full_home_goes_where_there_is_room() -> (
    None
):
    """Session ``s``'s first request fills its worker's KV (0.875 counted, the hard mark at
    0.95); its next request sends another text, none of which that worker holds. Holding
    it there is worth nothing (``Policy.hold_worth``), so it goes at once to the worker with
    room, bound there: ``kv_hold_moved``, not a hold."""
    async with (
        pressure_fleet(2) as fleet,
        running_gateway(pressure_config(fleet)) as gw,
        aiohttp.ClientSession() as session,
    ):
        for worker in fleet:
            await _scraped_capacity_of(gw, worker.url)
        pool, router = gw.gateway.pool, gw.gateway.router
        headers = {"X-Session-ID": "s"}
        first = asyncio.create_task(_send(session, gw, BODY, headers))
        await wait_until(lambda: sum(w.in_flight for w in pool) == 1, message="the first in flight")
        (home,) = [w for w in pool if w.in_flight == 1]
        url = gw.openai_base + "/completions"
        async with session.post(url, json=OTHER, headers=headers) as resp:
            await resp.read()
            assert resp.status == 200
            assert resp.headers["X-Kvgate-Route-Reason"] == "kv_hold_moved"
            assert resp.headers["X-Kvgate-Worker"] != home.id
        assert router.kv_holds == 0  # moved at once, never held
        assert await first == 200
