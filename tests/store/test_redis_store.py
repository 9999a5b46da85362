"""RedisStore beyond the shared contract: replicas, outages, resync, namespacing."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from kvgate.core.decision import Affinity
from kvgate.store import RedisStore
from kvgate.testing import free_port, wait_until
from kvgate.testing_redis import RedisServer, find_redis_server

pytestmark = pytest.mark.skipif(find_redis_server() is None, reason="redis-server not installed")

A = "http://10.0.0.1:8000"
B = "http://10.0.0.2:8000"
C = "http://10.0.0.3:8000"
TTL = 60.0
# Generous timeouts: on a loaded test machine a slow connect must not look like an
# outage. Outages here are real (stopped servers refuse connections at once).
PATIENT = {"socket_timeout": 1.0, "connect_timeout": 2.0}


def aff(key: str, worker: str, last_active: float = 1.0) -> Affinity:
    return Affinity(key, worker, "v1", last_active)


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A redis-server of this test's own, free to stop and restart."""
    with RedisServer() as server:
        yield server


@pytest.fixture
async def replicas(redis_url: str) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    """Two stores on one Redis, as two gateway replicas."""
    first = RedisStore(redis_url, **PATIENT)
    second = RedisStore(redis_url, **PATIENT)
    yield first, second
    await first.close()
    await second.close()


async def test_replicas_agree_on_placement(replicas: tuple[RedisStore, RedisStore]) -> None:
    first, second = replicas
    keys = [f"session-{i}" for i in range(30)]
    results = await asyncio.gather(
        *(first.compare_and_set(k, None, aff(k, A), TTL) for k in keys),
        *(second.compare_and_set(k, None, aff(k, B), TTL) for k in keys),
    )
    for i, key in enumerate(keys):
        assert results[i] == results[i + len(keys)]
        assert await first.get(key) == await second.get(key) == results[i]
    assert sum((await second.counts()).values()) == len(keys)


async def test_replica_sees_migration_by_the_other(replicas: tuple[RedisStore, RedisStore]) -> None:
    first, second = replicas
    await first.set(aff("s", A), TTL)
    assert await second.get("s") == aff("s", A)  # now in second's local mirror too
    assert await first.compare_and_set("s", A, aff("s", B), TTL) == aff("s", B)
    assert await second.get("s") == aff("s", B)
    # second, still believing A, loses its own migration attempt to the binding in force.
    assert await second.compare_and_set("s", A, aff("s", C), TTL) == aff("s", B)
    assert await first.sessions_of(B) == [aff("s", B)]
    assert await first.sessions_of(A) == []


async def test_keys_are_namespaced(redis_url: str) -> None:
    one = RedisStore(redis_url, prefix="one:", **PATIENT)
    two = RedisStore(redis_url, prefix="two:", **PATIENT)
    try:
        await one.set(aff("s", A), TTL)
        await one.put_blob("rollout", b"x")
        assert await two.get("s") is None
        assert await two.counts() == {}
        assert await two.get_blob("rollout") is None
        with redis.Redis.from_url(redis_url) as raw:
            # Each store keeps its epoch key (``store.epoch``); everything else is one's.
            keys = set(raw.keys("*")) - {b"one:epoch", b"two:epoch"}
            assert keys and all(key.startswith(b"one:") for key in keys)
            assert raw.pttl("one:s:s") > 0  # the binding carries its TTL
    finally:
        await one.close()
        await two.close()


async def test_unreachable_at_start_serves_locally(caplog: pytest.LogCaptureFixture) -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", backoff_initial=60.0)
    try:
        with caplog.at_level(logging.WARNING, logger="kvgate.store.redis_store"):
            assert await store.compare_and_set("s", None, aff("s", A), TTL) == aff("s", A)
            assert await store.get("s") == aff("s", A)
            assert await store.counts() == {A: 1}
            assert await store.get_many(["s", "t"]) == [aff("s", A), None]
        assert store.degraded
        assert store.errors_total == 2  # tried twice; later calls skip Redis until a probe succeeds
        assert store.fallbacks_total == 4
        assert sum("degraded" in r.getMessage() for r in caplog.records) == 1
    finally:
        await store.close()


async def test_unresponsive_redis_cannot_stall_routing() -> None:
    # A listener that never answers: connects succeed, reads time out.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        store = RedisStore(f"redis://127.0.0.1:{port}/0", socket_timeout=0.05, backoff_initial=60)
        try:
            started = time.monotonic()
            assert await store.get("s") is None
            assert await store.compare_and_set("s", None, aff("s", A), TTL) == aff("s", A)
            assert time.monotonic() - started < 2.0
            assert store.degraded
            assert store.errors_total == 2  # the first call, tried twice
        finally:
            await store.close()


async def test_outage_fallback_and_resync(
    own_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore(own_server.url, backoff_initial=0.02, backoff_max=0.1, **PATIENT)
    other = RedisStore(own_server.url, **PATIENT)
    try:
        await store.set(aff("before", A), TTL)
        await store.set(aff("deleted-later", A), TTL)
        assert not store.degraded

        own_server.stop()
        with caplog.at_level(logging.WARNING, logger="kvgate.store.redis_store"):
            # Every call answers, from the local map.
            assert await store.get("before") == aff("before", A)
            assert await store.compare_and_set("during", None, aff("during", B), TTL) == aff(
                "during", B
            )
            assert await store.touch("before", 9.0, TTL)
            assert await store.delete("deleted-later")
            await store.put_blob("rollout", b"step-3")
            assert await store.get_blob("rollout") == b"step-3"
            assert await store.counts() == {A: 1, B: 1}
            assert [a.session_key for a in await store.sessions_of(A)] == ["before"]
            assert store.degraded
            assert store.errors_total >= 1
            # Redis restarts empty on the same port; the store finds it and resyncs.
            own_server.start()
            await wait_until(lambda: not store.degraded, timeout=10, message="resync")
        warnings = [r.getMessage() for r in caplog.records]
        assert sum("degraded" in m for m in warnings) == 1
        assert store.resyncs_total == 1

        # What was written locally during the outage is in Redis now.
        assert await other.get("during") == aff("during", B)
        assert await other.get("before") == aff("before", A, last_active=9.0)
        assert await other.get_blob("rollout") == b"step-3"
        assert await other.get("deleted-later") is None
        # And later reads come from Redis, not the local map.
        await other.set(aff("during", C), TTL)
        await other.set(aff("new", C), TTL)
        assert await store.get("during") == aff("during", C)
        assert await store.get("new") == aff("new", C)
        assert await store.counts() == {A: 1, C: 2}
    finally:
        await store.close()
        await other.close()


async def test_resync_lets_redis_win_conflicts(own_server: RedisServer) -> None:
    # No background probing: the test decides when the store recovers.
    store = RedisStore(own_server.url, backoff_initial=3600, **PATIENT)
    try:
        await store.set(aff("agreed", A), TTL)
        own_server.stop()
        assert await store.compare_and_set("contested", None, aff("contested", A), TTL) == aff(
            "contested", A
        )
        assert await store.touch("agreed", 5.0, TTL)
        assert store.degraded
        assert not await store.try_recover()  # still down

        own_server.start()
        other = RedisStore(own_server.url, **PATIENT)
        try:
            # Another replica placed the session elsewhere while we were cut off.
            await other.set(aff("contested", B), TTL)
            assert await store.try_recover()
            assert not store.degraded
            assert await store.get("contested") == aff("contested", B)
            assert store.local.table.get("contested", store.local.clock()) == aff("contested", B)
            assert await other.get("agreed") == aff("agreed", A, last_active=5.0)
        finally:
            await other.close()
    finally:
        await store.close()


async def test_leases_are_not_granted_while_degraded(own_server: RedisServer) -> None:
    store = RedisStore(own_server.url, backoff_initial=3600, **PATIENT)
    try:
        assert await store.acquire_lease("controller", "me", TTL)
        own_server.stop()
        assert await store.acquire_lease("controller", "me", TTL)  # renewal of what we held
        assert not await store.acquire_lease("controller", "someone-else", TTL)
        assert not await store.acquire_lease("other-lease", "me", TTL)
        assert store.degraded
    finally:
        await store.close()


async def test_no_call_fails_when_redis_dies_mid_flight(own_server: RedisServer) -> None:
    store = RedisStore(own_server.url, backoff_initial=3600, **PATIENT)
    try:
        done = 0

        async def route(i: int) -> Affinity | None:
            nonlocal done
            key = f"s{i}"
            placed = await store.compare_and_set(key, None, aff(key, A if i % 2 else B), TTL)
            done += 1
            assert await store.get(key) == placed
            return placed

        async def outage() -> None:
            await wait_until(lambda: done >= 20, timeout=10, message="some calls to finish")
            own_server.stop()

        results = await asyncio.gather(*(route(i) for i in range(100)), outage())
        assert all(r is not None for r in results[:100])
        assert store.degraded
        assert sum((await store.counts()).values()) == 100
    finally:
        await store.close()


async def test_dirty_set_is_bounded(own_server: RedisServer) -> None:
    store = RedisStore(own_server.url, backoff_initial=3600, max_dirty=2, **PATIENT)
    try:
        own_server.stop()
        for key in ("s1", "s2", "s3"):
            await store.set(aff(key, A), TTL)
        assert store.dirty_dropped_total == 1
        own_server.start()
        assert await store.try_recover()
        with redis.Redis.from_url(own_server.url) as raw:
            assert sorted(raw.keys("kvgate:s:*")) == [b"kvgate:s:s2", b"kvgate:s:s3"]
    finally:
        await store.close()


async def test_a_cancelled_call_is_never_swallowed(redis_url: str) -> None:
    """A call cancelled mid-command raises ``CancelledError``, never returns its reply.

    redis-py can swallow a cancellation that lands inside a command; a request
    whose client went away would then go on to a worker. Swept over the loop
    turns a call spends awaiting, so the cancellation lands at each of them.
    """
    store = RedisStore(redis_url, **PATIENT)
    try:
        await store.get("warm-up")
        cancelled = 0
        for turns in range(40):
            key = f"cancel-{turns}"
            task = asyncio.ensure_future(
                store.compare_and_set(key, None, Affinity(key, "w", "v"), 60.0)
            )
            for _ in range(turns):
                if task.done():
                    break
                await asyncio.sleep(0)
            if task.done():
                continue
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            cancelled += 1
        assert cancelled > 0
        assert not store.degraded  # a cancellation is not a backend failure
    finally:
        await store.close()
