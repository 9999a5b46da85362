"""One owner of a worker's slot: a request's lease is given back exactly once on every path.

The leak this guards against (issue 12): a client that went away while the
router awaited the store's compare-and-set left ``place`` before the proxy took
charge of the slot, so the worker's in-flight count and KV estimate stayed
held until restart.

``place`` is swept deterministically: it runs as a task that is cancelled after
0, 1, 2, ... turns of the event loop until it completes, so every await it
makes (the store's compare-and-set, a queue wait, a KV hold) is hit, over a
store that yields at each operation as Redis does, and over Redis itself. The
forwarding path is swept the same way end to end, through the gateway, with
the client going away at each turn, on answers, streams and retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest

from kvgate.core.admission import AdmissionConfig
from kvgate.core.decision import Affinity
from kvgate.core.features import RequestFeatures
from kvgate.core.policies import default_registry
from kvgate.core.pressure import PressureConfig
from kvgate.core.route import RouteConfig
from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.dataplane.attempt import Attempt
from kvgate.gateway.dataplane.errors import GatewayError
from kvgate.gateway.dataplane.queue import AdmissionQueue
from kvgate.gateway.dataplane.router import Router
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.observe.scrape import WorkerSignals
from kvgate.gateway.routing import Routing
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.store import MemoryStore, RedisStore
from kvgate.store.base import AffinityStore
from kvgate.tasks import cancel_and_wait
from kvgate.testing import wait_until
from kvgate.testing_redis import RedisServer, find_redis_server
from kvgate.types import Seconds, SessionKey, WorkerId

from .conftest import every_worker_up, gateway_config, worker_fleet

pytestmark = pytest.mark.usefixtures("both_servers")

MONO = 100.0
CAPACITY = 1000


class YieldingStore(MemoryStore):
    """A memory store that yields to the event loop before every operation, as Redis does."""

    def __init__(self, stall: asyncio.Event | None = None) -> None:
        super().__init__()
        self.stall = stall
        """While set and not yet released, compare-and-set waits on it (a slow store)."""

    async def get(self, key: SessionKey) -> Affinity | None:
        await asyncio.sleep(0)
        return await super().get(key)

    async def compare_and_set(
        self, key: SessionKey, expected_worker: WorkerId | None, affinity: Affinity, ttl: Seconds
    ) -> Affinity:
        await asyncio.sleep(0)
        if self.stall is not None:
            await self.stall.wait()
        return await super().compare_and_set(key, expected_worker, affinity, ttl)

    async def touch(self, key: SessionKey, now: Seconds, ttl: Seconds) -> bool:
        await asyncio.sleep(0)
        return await super().touch(key, now, ttl)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    if find_redis_server() is None:
        pytest.skip("redis-server not installed")
    with RedisServer() as server:
        yield server


@contextlib.asynccontextmanager
async def open_store(kind: str, request: pytest.FixtureRequest) -> AsyncIterator[AffinityStore]:
    if kind == "memory":
        store: AffinityStore = YieldingStore()
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        store = RedisStore(server.url, socket_timeout=2.0, connect_timeout=2.0)
    try:
        yield store
    finally:
        await store.close()


def make_router(
    store: AffinityStore, *, max_in_flight: int = 4, max_wait_s: float = 0.05
) -> Router:
    """A router over two probed, scraped workers (no upstream: only ``place`` runs)."""
    workers = []
    for i in range(2):
        worker = Worker(WorkerConfig(url=f"http://w{i}:8000", model="m"), upstream=None)  # type: ignore[arg-type]
        worker.update(
            max_in_flight=max_in_flight,
            probe_ok=True,
            signals=WorkerSignals(running=0, waiting=0, kv_usage=0.0, kv_capacity_tokens=CAPACITY),
            signals_at=MONO,
        )
        workers.append(worker)
    gate = PressureConfig(chars_per_token=1.0, default_output_tokens=100)
    pool = WorkerPool(workers, stale_after=1e9, queue=AdmissionQueue(16), pressure=gate)
    admission = AdmissionConfig(max_wait_standard_s=max_wait_s)
    return Router(
        pool,
        Routing.of(default_registry().build("session_affinity")),
        store,
        GatewayMetrics(),
        RouteConfig(admission, gate, kv_gate_max_wait_s=max_wait_s),
        affinity_ttl=60.0,
        rng=random.Random(0),
        mono=lambda: MONO,
    )


def counts(pool: WorkerPool) -> tuple[int, int]:
    """In-flight requests and KV tokens counted on every worker."""
    return pool.in_flight(), sum(w.kv_in_flight_tokens for w in pool)


async def sweep(
    attempt: Callable[[], Awaitable[Attempt]], pool: WorkerPool, baseline: tuple[int, int]
) -> int:
    """Cancel ``attempt`` after 0, 1, 2, ... loop turns until it completes, checking counts.

    Returns how many cancellations it took (the number of turns ``place`` spends awaiting).
    """
    turns = -1
    while turns < 100_000:
        turns += 1
        task = asyncio.ensure_future(attempt())
        for _ in range(turns):
            if task.done():
                break
            await asyncio.sleep(0)
        if task.done():
            with contextlib.suppress(GatewayError):
                attempt = task.result()
                assert counts(pool) > baseline
                attempt.cancelled()
            assert counts(pool) == baseline
            return turns
        task.cancel()
        try:
            late = await task
        except (asyncio.CancelledError, GatewayError):
            pass
        else:
            # A cancellation swallowed below (the Redis store guards against
            # redis-py doing so): the placement is the caller's, with its lease.
            late.cancelled()
        assert counts(pool) == baseline, f"leaked after a cancel at turn {turns}"
        if turns >= 50:
            turns += turns // 5  # past the first awaits only waits remain: go faster
    raise AssertionError("place never completed")


def features(session: str, prompt_chars: int = 100) -> RequestFeatures:
    return RequestFeatures(
        request_id=session, model="m", session_key=session, prompt_chars=prompt_chars, max_tokens=1
    )


async def test_a_place_cancelled_while_the_store_stalls_gives_its_slot_back() -> None:
    """The issue's reproduction: a compare-and-set that waits, and a cancelled ``place``."""
    stall = asyncio.Event()
    store = YieldingStore(stall)
    router = make_router(store)
    task = asyncio.ensure_future(router.place(features("s1"), None))
    await wait_until(lambda: router.pool.in_flight() == 1, message="the slot taken")
    await cancel_and_wait(task)
    assert counts(router.pool) == (0, 0)


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_place_cancelled_at_every_await_gives_everything_back(
    kind: str, request: pytest.FixtureRequest
) -> None:
    async with open_store(kind, request) as store:
        router = make_router(store)
        pool = router.pool
        # A new session: the store's compare-and-set is awaited with the slot taken.
        turns = await sweep(lambda: router.place(features("new"), None), pool, (0, 0))
        assert turns >= 1
        # A known session on the other worker: the lookup returned it, the write moves it.
        bound = Affinity("known", "http://w1:8000", "default")
        await store.set(bound, 60.0)
        await sweep(lambda: router.place(features("known"), bound), pool, (0, 0))
        # A KV hold: the other worker is gone and this one's KV is nearly committed.
        first = pool.get("http://w0:8000")
        other = pool.get("http://w1:8000")
        assert first is not None and other is not None
        other.update(ejected=True)
        held = pool.lease(first, 800)  # under the soft mark: still takes new sessions
        holds = router.kv_holds
        await sweep(lambda: router.place(features("held", 300), None), pool, (1, 800))
        assert router.kv_holds > holds
        # A full fleet: the request waits in the queue, then is refused.
        for _ in range(3):
            pool.lease(first)
        await sweep(lambda: router.place(features("queued"), None), pool, (4, 800))
        held.release()


# -- end to end: the client goes away at every turn of forwarding ----------------------


async def client_sweep(
    gw: GatewayHandle, body: dict[str, Any], headers: dict[str, str] | None = None
) -> int:
    """Post ``body`` and give up after 0, 1, 2, ... loop turns until a request completes.

    After each, once the gateway has finished with the request, nothing may stay
    counted on any worker. Returns the turns a whole request took.
    """
    pool, proxy = gw.gateway.pool, gw.gateway.proxy
    url = gw.openai_base + "/chat/completions"
    turns = 0
    async with aiohttp.ClientSession() as session:

        async def send() -> int:
            async with session.post(url, json=body, headers=headers) as resp:
                await resp.read()
                return resp.status

        while True:
            task = asyncio.ensure_future(send())
            for _ in range(turns):
                if task.done():
                    break
                await asyncio.sleep(0)
            done = task.done()
            if not done:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                status = await task
            await wait_until(lambda: proxy.in_flight == 0, message="the request finished")
            assert counts(pool) == (0, 0), f"leaked after the client left at turn {turns}"
            if done:
                assert status == 200
                return turns
            # Past the first hundred turns the request waits on the worker: go faster.
            turns += 1 if turns < 100 else 1 + turns // 20


def chat(session: str, *, stream: bool) -> dict[str, Any]:
    return {
        "model": "demo",
        "messages": [{"role": "user", "content": f"hello from {session} " * 20}],
        "max_tokens": 8,
        "stream": stream,
        "user": session,
    }


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_client_leaving_at_any_point_leaves_nothing_counted(
    kind: str, request: pytest.FixtureRequest
) -> None:
    async with (
        worker_fleet(2) as fleet,
        open_store(kind, request) as store,
        running_gateway(gateway_config(fleet), store=store) as gw,
    ):
        await every_worker_up(gw)
        for stream in (False, True):
            turns = await client_sweep(gw, chat(f"{kind}-{stream}", stream=stream))
            assert turns > 10


async def test_a_client_leaving_during_retries_leaves_nothing_counted() -> None:
    """One worker always fails: round robin sends every other attempt there first.

    Attempts, their early releases and the backoffs between them are all crossed.
    """
    async with worker_fleet(1, error_rate=1.0) as broken, worker_fleet(1) as good:
        config = gateway_config(
            broken + good,
            policy={"name": "round_robin"},
            retries={"count": 2, "backoff_base_s": 0.002, "backoff_max_s": 0.002},
            outlier={"consecutive_failures": 1000},
        )
        async with running_gateway(config) as gw:
            await every_worker_up(gw)
            await client_sweep(gw, chat("retry-sweep", stream=False))
            metrics = gw.gateway.metrics.render().decode()
    retried = [line for line in metrics.splitlines() if line.startswith("kvgate_retries_total{")]
    assert retried and float(retried[0].split()[-1]) >= 1
