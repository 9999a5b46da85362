"""The routing seam live: admission (queue, 429, 503) and the affinity store."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp

from kvgate.core.decision import Affinity
from kvgate.gateway.testing import running_gateway
from kvgate.store import MemoryStore
from kvgate.testing import wait_until
from kvgate.types import Seconds, SessionKey, WorkerId
from kvgate.workersim.runner import WorkerHandle

from .conftest import gateway_config, worker_fleet

BODY = {"model": "demo", "prompt": "hello", "max_tokens": 2}


async def post(session: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, Any, Any]:
    async with session.post(url, json=BODY, **kw) as resp:
        return resp.status, await resp.json(), resp.headers


async def test_all_workers_full_sheds_with_429_and_retry_after() -> None:
    async with worker_fleet(1, extra_latency_ms=400) as fleet:
        config = gateway_config(
            fleet,
            workers=[{"url": fleet[0].url, "max_in_flight": 1}],
            admission={"max_wait_standard_s": 0},
        )
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            url = gw.openai_base + "/completions"
            first = asyncio.create_task(post(session, url))
            await wait_until(lambda: gw.gateway.pool.in_flight() == 1, message="first in flight")
            status, body, headers = await post(session, url)
            assert (await first)[0] == 200
            metrics = gw.gateway.metrics.render().decode()
    assert status == 429
    assert body["error"]["type"] == "rate_limit_error"
    assert int(headers["Retry-After"]) >= 1
    assert 'kvgate_shed_total{priority="standard",reason="saturated"} 1.0' in metrics


async def test_a_full_fleet_queues_until_a_worker_frees_up() -> None:
    async with worker_fleet(1, extra_latency_ms=200) as fleet:
        config = gateway_config(fleet, workers=[{"url": fleet[0].url, "max_in_flight": 1}])
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            url = gw.openai_base + "/completions"
            results = await asyncio.gather(*(post(session, url) for _ in range(3)))
            metrics = gw.gateway.metrics.render().decode()
    assert [r[0] for r in results] == [200, 200, 200]
    assert 'kvgate_queue_wait_seconds_count{priority="standard"} 2.0' in metrics


async def test_no_healthy_worker_is_503_and_not_ready(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw, aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/readyz") as resp:
            assert resp.status == 200
        for worker in workers:
            await worker.kill()
        await wait_until(lambda: not gw.gateway.ready(), message="gateway not ready")
        status, body, _ = await post(session, gw.openai_base + "/completions")
        async with session.get(gw.url + "/readyz") as resp:
            ready = resp.status
    assert status == 503
    assert body["error"]["code"] == "no_healthy_worker"
    assert ready == 503


class _BrokenStore(MemoryStore):
    """A store whose every affinity operation fails (its rollout blobs still work)."""

    async def get(self, key: SessionKey) -> Affinity | None:
        raise ConnectionError("store down")

    async def get_many(self, keys: Sequence[SessionKey]) -> list[Affinity | None]:
        raise ConnectionError("store down")

    async def set(self, affinity: Affinity, ttl: Seconds) -> None:
        raise ConnectionError("store down")

    async def compare_and_set(
        self, key: SessionKey, expected_worker: WorkerId | None, affinity: Affinity, ttl: Seconds
    ) -> Affinity:
        raise ConnectionError("store down")

    async def touch(self, key: SessionKey, now: Seconds, ttl: Seconds) -> bool:
        raise ConnectionError("store down")

    async def get_holders(self, blocks: Sequence[int]) -> list[WorkerId | None]:
        raise ConnectionError("store down")

    async def set_holders(
        self, entries: Sequence[tuple[int, WorkerId]], ttl: Seconds, tenant: str = ""
    ) -> None:
        raise ConnectionError("store down")

    async def delete(self, key: SessionKey) -> bool:
        raise ConnectionError("store down")

    async def sessions_of(self, worker: WorkerId, limit: int | None = None) -> list[Affinity]:
        raise ConnectionError("store down")

    async def counts(self) -> dict[WorkerId, int]:
        raise ConnectionError("store down")


async def test_store_errors_never_fail_a_request(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers), store=_BrokenStore()) as gw:
        async with aiohttp.ClientSession() as session:
            statuses = [
                (await post(session, gw.openai_base + "/completions", headers=h))[0]
                for h in ({}, {"X-Session-ID": "s1"}, {"X-Session-ID": "s1"})
            ]
        metrics = gw.gateway.metrics.render().decode()
    assert statuses == [200, 200, 200]
    assert 'kvgate_store_errors_total{op="get"}' in metrics


class _OtherReplicaWins(MemoryStore):
    """A store where another replica always bound the session first, elsewhere."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__()
        self.urls = urls

    async def compare_and_set(
        self, key: SessionKey, expected_worker: WorkerId | None, affinity: Affinity, ttl: Seconds
    ) -> Affinity:
        other = next(u for u in self.urls if u != affinity.worker)
        return Affinity(key, other, affinity.version)


async def test_losing_the_affinity_race_follows_the_binding_in_force(
    workers: list[WorkerHandle],
) -> None:
    store = _OtherReplicaWins([w.url for w in workers])
    async with (
        running_gateway(gateway_config(workers), store=store) as gw,
        aiohttp.ClientSession() as session,
    ):
        status, _, headers = await post(
            session, gw.openai_base + "/completions", headers={"X-Session-ID": "race"}
        )
        pool = gw.gateway.pool
        # The slot moved with the request and was given back once, on the worker it ran on.
        counted = [(w.in_flight, w.kv_in_flight_tokens) for w in pool]
    assert status == 200
    assert headers["X-Kvgate-Route-Reason"] == "affinity_race"
    assert counted == [(0, 0)] * len(workers)
