"""Gateway replicas sharing a store see each other's requests in flight (``control.peers``),
and a replica that stops publishing drops out at its TTL: in memory on an injected clock,
in Redis on Redis's own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.control.peers import PeerLoads
from kvgate.gateway.dataplane.queue import AdmissionQueue
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.observe.scrape import WorkerSignals
from kvgate.store import AffinityStore, MemoryStore, RedisStore
from kvgate.testing import wait_until
from kvgate.testing_redis import RedisServer, find_redis_server

TTL_S = 0.5  # real seconds on Redis


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def replica() -> tuple[WorkerPool, list[Worker]]:
    """One replica's pool of the same two workers (model ``m``)."""
    workers = []
    for i in range(2):
        worker = Worker(WorkerConfig(url=f"http://w{i}:8000", model="m"), upstream=None)  # type: ignore[arg-type]
        worker.update(probe_ok=True, signals=WorkerSignals(running=0, waiting=0), signals_at=0.0)
        workers.append(worker)
    return WorkerPool(workers, stale_after=1e9, queue=AdmissionQueue(8)), workers


def in_flight(pool: WorkerPool) -> list[tuple[int, int]]:
    snap = pool.snapshot("m", 0.0, 1.0)
    return [(w.in_flight, w.kv_in_flight_tokens) for w in snap.workers]


@pytest.fixture(params=["memory", "redis"])
async def shared(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[AffinityStore, Clock | None]]:
    """One store both replicas use, and its clock where the test moves it."""
    if request.param == "memory":
        clock = Clock()
        yield MemoryStore(clock=clock), clock
        return
    if find_redis_server() is None:
        pytest.skip("redis-server not installed")
    server: RedisServer = request.getfixturevalue("redis_server")
    with redis.Redis.from_url(server.url) as client:
        client.flushall()
    store = RedisStore(server.url, socket_timeout=1.0, connect_timeout=2.0)
    yield store, None
    await store.close()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for this module's tests (each flushes it)."""
    if find_redis_server() is None:
        pytest.skip("redis-server not installed")
    with RedisServer() as server:
        yield server


async def test_replicas_count_each_others_requests_in_flight(
    shared: tuple[AffinityStore, Clock | None],
) -> None:
    store, _ = shared
    (pool_a, (a0, _)), (pool_b, (_, b1)) = replica(), replica()
    peers_a = PeerLoads(pool_a, store, replica="a", ttl_s=TTL_S)
    peers_b = PeerLoads(pool_b, store, replica="b", ttl_s=TTL_S)
    lease_a = pool_a.lease(a0, kv_tokens=300)
    lease_b = pool_b.lease(b1, kv_tokens=50)
    await peers_a.exchange()
    await peers_b.exchange()
    assert in_flight(pool_b) == [(1, 300), (1, 50)]  # a's request on w0 and its own on w1
    await peers_a.exchange()
    assert in_flight(pool_a) == [(1, 300), (1, 50)]
    assert (peers_a.peers, peers_b.peers) == (1, 1)
    lease_a.release()
    await peers_a.exchange()
    await peers_b.exchange()
    assert in_flight(pool_b) == [(0, 0), (1, 50)]
    assert a0.routed.in_flight == 0 and b1.routed.in_flight == 1  # each its own, apart
    lease_b.release()


async def test_a_silent_replica_drops_out_at_its_ttl(
    shared: tuple[AffinityStore, Clock | None],
) -> None:
    store, clock = shared
    (pool_a, (a0, _)), (pool_b, _) = replica(), replica()
    peers_a = PeerLoads(pool_a, store, replica="a", ttl_s=TTL_S)
    peers_b = PeerLoads(pool_b, store, replica="b", ttl_s=TTL_S)
    pool_a.lease(a0, kv_tokens=300)  # never released: a dies with it in flight
    await peers_a.exchange()
    await peers_b.exchange()
    assert in_flight(pool_b)[0] == (1, 300)
    if clock is not None:
        clock.now += TTL_S  # a publishes no more

    async def dropped() -> bool:
        await peers_b.exchange()
        return in_flight(pool_b)[0] == (0, 0)

    await wait_until(dropped, timeout=5, message="the silent replica's counts to expire")
    assert peers_b.peers == 0


async def test_one_replica_alone_changes_nothing() -> None:
    pool, (w0, _) = replica()
    peers = PeerLoads(pool, MemoryStore(clock=Clock()), replica="alone")
    pool.lease(w0, kv_tokens=10)
    before = pool.snapshot("m", 0.0, 1.0)
    await peers.exchange()
    assert pool.snapshot("m", 0.0, 1.0) == before
    assert peers.peers == 0
