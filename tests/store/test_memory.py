"""MemoryStore beyond the shared contract: the LRU bound and exact expiry on its clock."""

from __future__ import annotations

from kvgate.core.decision import Affinity
from kvgate.store import MemoryStore

from .harness import FakeClock

A = "http://10.0.0.1:8000"
B = "http://10.0.0.2:8000"
TTL = 60.0


def aff(key: str, worker: str = A, last_active: float = 1.0) -> Affinity:
    return Affinity(key, worker, "v1", last_active)


async def test_least_recently_used_is_evicted_past_the_bound() -> None:
    store = MemoryStore(max_sessions=3, clock=FakeClock())
    for key in ("s1", "s2", "s3"):
        await store.set(aff(key), TTL)
    assert await store.touch("s1", 2.0, TTL)  # s2 is now least recently used
    await store.compare_and_set("s4", None, aff("s4", B), TTL)
    assert await store.get("s2") is None
    assert [await store.get(k) is not None for k in ("s1", "s3", "s4")] == [True] * 3
    assert len(store) == 3
    assert store.evictions_total == 1
    assert await store.counts() == {A: 2, B: 1}
    assert [a.session_key for a in await store.sessions_of(A)] == ["s3", "s1"]


async def test_expired_sessions_make_room_before_live_ones_are_evicted() -> None:
    clock = FakeClock()
    store = MemoryStore(max_sessions=2, clock=clock)
    await store.set(aff("short"), 1.0)
    await store.set(aff("long"), TTL)
    clock.advance(5.0)
    await store.set(aff("new"), TTL)
    assert store.evictions_total == 0
    assert await store.get("long") is not None
    assert await store.counts() == {A: 2}


async def test_expiry_is_exact_on_the_injected_clock() -> None:
    clock = FakeClock(start=100.0)
    store = MemoryStore(clock=clock, expiry_granularity=10.0)
    await store.set(aff("s"), 2.5)
    clock.advance(2.4)
    assert await store.counts() == {A: 1}
    assert await store.get("s") is not None
    clock.advance(0.1)  # the deadline itself counts as expired
    assert await store.counts() == {}
    assert await store.get("s") is None
    assert len(store) == 0


async def test_touch_moves_the_deadline_not_the_clock() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    await store.set(aff("s"), 10.0)
    clock.advance(8.0)
    # last_active is the caller's time; expiry follows the store's clock.
    assert await store.touch("s", 12345.0, 10.0)
    clock.advance(8.0)
    assert await store.get("s") == aff("s", last_active=12345.0)
    clock.advance(2.0)
    assert await store.get("s") is None


async def test_close_forgets_everything() -> None:
    store = MemoryStore(clock=FakeClock())
    await store.set(aff("s"), TTL)
    await store.put_blob("b", b"x")
    assert await store.acquire_lease("l", "me", TTL)
    await store.close()
    assert await store.get("s") is None
    assert await store.get_blob("b") is None
    assert await store.acquire_lease("l", "you", TTL)


async def test_writes_sweep_expired_sessions_without_being_asked() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    for i in range(100):
        await store.set(aff(f"old{i}"), 1.0)
    clock.advance(5.0)
    await store.set(aff("new"), TTL)
    assert len(store) == 1
    assert store.table.expirations_total == 100
