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


def _tenant_keys(credential: bytes, count: int, start: int = 0) -> list[str]:
    from kvgate.core.session import owned, scoped

    keys = []
    for i in range(start, start + count):
        key = scoped(f"session-{i}", credential) if i % 2 else owned(f"response:r{i}", credential)
        assert key is not None
        keys.append(key)
    return keys


async def test_a_tenants_flood_evicts_only_its_own_oldest_sessions() -> None:
    """One client sending ever new session ids (or making ever new responses) evicted
    every other tenant's bindings and response owners from the bounded table (their
    continuations then 404). Past ``max_per_scope`` it evicts its own oldest."""
    clock = FakeClock()
    store = MemoryStore(max_sessions=100, clock=clock, max_per_scope=30)
    bob = _tenant_keys(b"sk-bob", 10)
    for key in bob:
        await store.set(aff(key, B), TTL)
    alice = _tenant_keys(b"sk-alice", 500)
    for key in alice:
        clock.advance(0.01)
        await store.compare_and_set(key, None, aff(key), TTL)
        assert await store.touch(key, clock(), TTL)
    assert all([await store.get(key) is not None for key in bob])
    kept = [key for key in alice if await store.get(key) is not None]
    assert kept == alice[-30:]
    assert len(store) == 40 and store.evictions_total == 470
    assert await store.counts() == {A: 30, B: 10}


async def test_a_full_table_is_shared_evenly_between_tenants() -> None:
    """Without a per-scope bound, a tenant holding its even share of a full table or more
    makes room from its own sessions; below it, the least recently used goes."""
    store = MemoryStore(max_sessions=100, clock=FakeClock())
    bob = _tenant_keys(b"sk-bob", 70)
    for key in bob:
        await store.set(aff(key, B), TTL)
    for key in _tenant_keys(b"sk-alice", 1000):
        await store.set(aff(key), TTL)
    # Bob lost his 20 oldest until Alice held her half; then she evicted her own.
    assert [await store.get(key) is not None for key in bob] == [False] * 20 + [True] * 50
    assert await store.counts() == {A: 50, B: 50}
    # One tenant alone is evicted least recently used first, as before.
    solo = MemoryStore(max_sessions=3, clock=FakeClock())
    for key in ("s1", "s2", "s3", "s4"):
        await solo.set(aff(key), TTL)
    assert [await solo.get(k) is not None for k in ("s1", "s2", "s3", "s4")] == [False] + [True] * 3


def test_published_loads_are_bounded_and_a_known_replica_keeps_its_place() -> None:
    from kvgate.store.loads import LoadTable

    table = LoadTable(max_replicas=2)
    table.exchange("r1", b"1", 0.0, 1.0)
    table.exchange("r2", b"2", 0.0, 1.0)
    assert table.exchange("r3", b"3", 0.5, 1.0) == {"r1": b"1", "r2": b"2"}  # no room
    assert table.exchange("r1", b"1b", 0.5, 1.0) == {"r1": b"1b", "r2": b"2"}
    assert table.exchange("r3", b"3", 1.0, 1.0) == {"r1": b"1b", "r3": b"3"}  # r2 expired
