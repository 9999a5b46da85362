"""The behaviour every AffinityStore backend must show, run against each of them."""

from __future__ import annotations

import asyncio

from kvgate.core.decision import Affinity
from kvgate.store import AffinityStore
from kvgate.testing import wait_until

from .harness import StoreUnderTest

A = "http://10.0.0.1:8000"
B = "http://10.0.0.2:8000"
C = "http://10.0.0.3:8000"
TTL = 60.0
SHORT_TTL = 0.3  # real seconds on Redis: short enough to keep the suite fast


def aff(key: str, worker: str, version: str = "v1", last_active: float = 1.0) -> Affinity:
    return Affinity(key, worker, version, last_active)


async def test_is_an_affinity_store(sut: StoreUnderTest) -> None:
    assert isinstance(sut.store, AffinityStore)
    assert not sut.store.degraded
    assert sut.store.errors_total == 0


async def test_get_set_roundtrip_and_overwrite(sut: StoreUnderTest) -> None:
    store = sut.store
    assert await store.get("s1") is None
    await store.set(aff("s1", A, "v2.1", 12.5), TTL)
    assert await store.get("s1") == aff("s1", A, "v2.1", 12.5)
    await store.set(aff("s1", B, "v3.0-beta", 13.0), TTL)
    assert await store.get("s1") == aff("s1", B, "v3.0-beta", 13.0)
    assert await store.counts() == {B: 1}


async def test_get_many_keeps_order_and_gaps(sut: StoreUnderTest) -> None:
    await sut.store.set(aff("s1", A), TTL)
    await sut.store.set(aff("s3", B), TTL)
    assert await sut.store.get_many(["s3", "s2", "s1"]) == [aff("s3", B), None, aff("s1", A)]


async def test_compare_and_set_rules(sut: StoreUnderTest) -> None:
    store = sut.store
    # Only-if-absent wins on a new key, loses once bound.
    assert await store.compare_and_set("s1", None, aff("s1", A), TTL) == aff("s1", A)
    assert await store.compare_and_set("s1", None, aff("s1", B), TTL) == aff("s1", A)
    # A wrong expectation returns the binding in force, unchanged.
    assert await store.compare_and_set("s1", C, aff("s1", B), TTL) == aff("s1", A)
    # The right expectation moves the session (migration).
    moved = aff("s1", B, "v2", 5.0)
    assert await store.compare_and_set("s1", A, moved, TTL) == moved
    assert await store.get("s1") == moved
    assert await store.counts() == {B: 1}
    # An absent binding matches any expectation.
    assert await store.compare_and_set("s2", A, aff("s2", C), TTL) == aff("s2", C)


async def test_concurrent_compare_and_set_has_one_winner(sut: StoreUnderTest) -> None:
    store = sut.store
    for i in range(20):
        key = f"race-{i}"
        first, second = await asyncio.gather(
            store.compare_and_set(key, None, aff(key, A), TTL),
            store.compare_and_set(key, None, aff(key, B), TTL),
        )
        assert first == second
        assert first.worker in (A, B)
        assert await store.get(key) == first
    assert sum((await store.counts()).values()) == 20


async def test_bindings_expire_after_their_ttl(sut: StoreUnderTest) -> None:
    store = sut.store
    await store.set(aff("short", A, last_active=1.0), SHORT_TTL)
    await store.compare_and_set("short-cas", None, aff("short-cas", A), SHORT_TTL)
    await store.set(aff("long", B), TTL)
    assert await store.get("short") is not None
    sut.elapse(SHORT_TTL + 0.01)

    async def expired() -> bool:
        return await store.get("short") is None and await store.get("short-cas") is None

    await wait_until(expired, timeout=5, message="short bindings to expire")
    assert await store.counts() == {B: 1}
    assert await store.sessions_of(A) == []
    assert await store.get("long") == aff("long", B)


async def test_touch_refreshes_ttl_and_activity(sut: StoreUnderTest) -> None:
    store = sut.store
    assert not await store.touch("missing", 5.0, TTL)
    assert await store.get("missing") is None
    await store.set(aff("kept", A, last_active=1.0), SHORT_TTL)
    await store.set(aff("dropped", A, last_active=1.0), SHORT_TTL)
    assert await store.touch("kept", 7.5, TTL)
    assert await store.get("kept") == aff("kept", A, last_active=7.5)
    sut.elapse(SHORT_TTL + 0.01)

    async def dropped_gone() -> bool:
        return await store.get("dropped") is None

    # Both had the same TTL; only the touched one outlives it.
    await wait_until(dropped_gone, timeout=5, message="untouched binding to expire")
    assert await store.get("kept") == aff("kept", A, last_active=7.5)
    assert await store.counts() == {A: 1}


async def test_delete(sut: StoreUnderTest) -> None:
    store = sut.store
    await store.set(aff("s1", A), TTL)
    await store.set(aff("s2", A), TTL)
    assert await store.delete("s1")
    assert not await store.delete("s1")
    assert await store.get("s1") is None
    assert await store.counts() == {A: 1}
    assert [a.session_key for a in await store.sessions_of(A)] == ["s2"]


async def test_sessions_of_least_recently_active_first(sut: StoreUnderTest) -> None:
    store = sut.store
    for key, last_active in [("c", 30.0), ("a", 10.0), ("e", 50.0), ("b", 20.0), ("d", 40.0)]:
        await store.set(aff(key, A, last_active=last_active), TTL)
    await store.set(aff("other", B, last_active=1.0), TTL)
    assert [a.session_key for a in await store.sessions_of(A)] == ["a", "b", "c", "d", "e"]
    assert [a.session_key for a in await store.sessions_of(A, limit=2)] == ["a", "b"]
    assert await store.sessions_of(A, limit=0) == []
    assert await store.touch("a", 60.0, TTL)
    assert [a.session_key for a in await store.sessions_of(A)] == ["b", "c", "d", "e", "a"]
    assert (await store.sessions_of(A))[-1] == aff("a", A, last_active=60.0)
    assert await store.sessions_of("http://unknown:1") == []


async def test_counts_follow_every_write(sut: StoreUnderTest) -> None:
    store = sut.store
    assert await store.counts() == {}
    for i in range(3):
        await store.set(aff(f"a{i}", A), TTL)
    for i in range(2):
        await store.compare_and_set(f"b{i}", None, aff(f"b{i}", B), TTL)
    assert await store.counts() == {A: 3, B: 2}
    await store.compare_and_set("a0", A, aff("a0", C), TTL)
    await store.delete("b0")
    assert await store.counts() == {A: 2, B: 1, C: 1}


async def test_blobs(sut: StoreUnderTest) -> None:
    store = sut.store
    assert await store.get_blob("rollout") is None
    payload = b'{"step": 2}\x00\xff'
    await store.put_blob("rollout", payload)
    assert await store.get_blob("rollout") == payload
    await store.put_blob("rollout", b"v2")
    assert await store.get_blob("rollout") == b"v2"
    assert await store.get_blob("other") is None


async def test_lease_is_exclusive_and_renewable(sut: StoreUnderTest) -> None:
    store = sut.store
    assert await store.acquire_lease("controller", "replica-1", TTL)
    assert not await store.acquire_lease("controller", "replica-2", TTL)
    assert await store.acquire_lease("controller", "replica-1", TTL)  # renew
    assert not await store.release_lease("controller", "replica-2")
    assert await store.release_lease("controller", "replica-1")
    assert await store.acquire_lease("controller", "replica-2", TTL)
    assert await store.acquire_lease("other", "replica-1", TTL)


async def test_lease_lapses_after_its_ttl(sut: StoreUnderTest) -> None:
    store = sut.store
    assert await store.acquire_lease("controller", "replica-1", SHORT_TTL)
    assert not await store.acquire_lease("controller", "replica-2", TTL)
    sut.elapse(SHORT_TTL + 0.01)

    async def taken_over() -> bool:
        return await store.acquire_lease("controller", "replica-2", TTL)

    await wait_until(taken_over, timeout=5, message="lease to lapse")
    assert not await store.acquire_lease("controller", "replica-1", TTL)


async def test_replicas_see_each_others_loads_until_a_silent_one_expires(
    sut: StoreUnderTest,
) -> None:
    store = sut.store
    assert await store.exchange_loads("r1", b"one", TTL) == {"r1": b"one"}
    assert await store.exchange_loads("r2", b"two", SHORT_TTL) == {"r1": b"one", "r2": b"two"}
    assert await store.exchange_loads("r1", b"one again", TTL) == {
        "r1": b"one again",
        "r2": b"two",
    }
    sut.elapse(SHORT_TTL + 0.01)  # r2 publishes no more

    async def gone() -> bool:
        return await store.exchange_loads("r1", b"one", TTL) == {"r1": b"one"}

    await wait_until(gone, timeout=5, message="the silent replica's loads to expire")
