"""What one tenant can make the store hold: its own bound, never another tenant's room.

A session id and a stored response's owner are written by whoever sends requests; the
store is bounded (memory) or grows with what is written (Redis). A client sending ever new
ids evicted every other tenant's bindings (their continuations then 404) from the memory
store, and could fill Redis. Each tenant (``core.session.tenant_of``) is bounded on its own.
"""

from __future__ import annotations

import pytest
import redis

from kvgate.core.decision import Affinity
from kvgate.core.session import owned, scoped, tenant_of
from kvgate.store import MemoryStore, RedisStore
from kvgate.store.base import AffinityStore

from .harness import FakeClock

A = "http://10.0.0.1:8000"
B = "http://10.0.0.2:8000"
TTL = 60.0
PATIENT = {"socket_timeout": 1.0, "connect_timeout": 2.0}


def tenant_keys(credential: bytes, count: int) -> list[str]:
    """Session keys and stored responses' keys, in turn, of one credential's scope."""
    keys = []
    for i in range(count):
        key = scoped(f"session-{i}", credential) if i % 2 else owned(f"response:r{i}", credential)
        assert key is not None
        keys.append(key)
    return keys


def test_keys_name_their_tenant_and_nothing_else_does() -> None:
    alice, bob = tenant_keys(b"sk-alice", 2), tenant_keys(b"sk-bob", 2)
    assert len({tenant_of(k) for k in alice}) == 1 and tenant_of(alice[0]) != tenant_of(bob[0])
    assert all(len(tenant_of(k)) == 16 and "alice" not in k for k in alice)
    # Unscoped ids (and ones posing as scoped keys, hashed) are the unscoped tenant's.
    posing = scoped(alice[1], None)
    assert posing is not None and tenant_of(posing) == "" and tenant_of("plain-id") == ""
    assert tenant_of(owned("response:r", None) or "x") == ""  # the credential-less scope


async def flood(store: AffinityStore, clock: FakeClock | None = None) -> list[str]:
    """Bob binds 10 sessions; Alice binds 500 (and touches each): Alice's keys."""
    for key in tenant_keys(b"sk-bob", 10):
        await store.set(Affinity(key, B, "v1", 1.0), TTL)
    alice = tenant_keys(b"sk-alice", 500)
    for n, key in enumerate(alice):
        if clock is not None:
            clock.advance(0.01)
        await store.compare_and_set(key, None, Affinity(key, A, "v1", float(n)), TTL)
        assert await store.touch(key, float(n), TTL)
    return alice


async def test_a_flood_keeps_other_tenants_bindings_in_memory() -> None:
    clock = FakeClock()
    store = MemoryStore(max_sessions=100, clock=clock, max_per_scope=30)
    alice = await flood(store, clock)
    bob = tenant_keys(b"sk-bob", 10)
    assert [await store.get(k) is not None for k in bob] == [True] * 10
    assert [k for k in alice if await store.get(k) is not None] == alice[-30:]


async def test_a_flood_keeps_other_tenants_bindings_in_redis(redis_url: str) -> None:
    """Redis held every id a client sent (until its TTL): Alice's flood could fill it (its
    maxmemory policy then evicts anyone's, or refuses writes). Now her own least recently
    used go past the bound, in Redis and its local mirror alike."""
    store = RedisStore(redis_url, prefix="kv:", max_per_scope=30, **PATIENT)
    try:
        alice = await flood(store)
        bob = tenant_keys(b"sk-bob", 10)
        assert [await store.get(k) is not None for k in bob] == [True] * 10
        assert [k for k in alice if await store.get(k) is not None] == alice[-30:]
        assert await store.counts() == {A: 30, B: 10}
        assert {a.session_key for a in await store.sessions_of(A)} == set(alice[-30:])
        # What Redis holds: 40 bindings and each tenant's bound, nothing more.
        with redis.Redis.from_url(redis_url) as client:
            bound = {k.decode() for k in client.scan_iter("kv:t:*")}
            assert {client.zcard(k) for k in bound} == {10, 30}
            assert sum(1 for _ in client.scan_iter("kv:s:*")) == 40
            for key in bob[:3]:
                assert await store.delete(key)
            assert sorted(client.zcard(k) for k in bound) == [7, 30]
        assert await store.local.get(alice[0]) is None  # the mirror is bounded alike
    finally:
        await store.close()


@pytest.mark.parametrize("bound", [None, 40])
async def test_without_a_flood_nothing_is_evicted(redis_url: str, bound: int | None) -> None:
    store = RedisStore(redis_url, prefix="kv:", max_per_scope=bound, **PATIENT)
    try:
        keys = tenant_keys(b"sk-alice", 40)
        for key in keys:
            await store.set(Affinity(key, A, "v1", 1.0), TTL)
        assert all([await store.get(k) is not None for k in keys])
    finally:
        await store.close()


async def test_a_flood_is_bounded_on_every_shard_of_a_cluster(cluster_url: str) -> None:
    """On Redis Cluster each shard keeps a tenant's share of the bound (its sorted set
    shares the sessions' hash tag, so each script stays on one slot)."""
    store = RedisStore(cluster_url, max_per_scope=160, **PATIENT)  # 10 on each of 16 shards
    try:
        bob = tenant_keys(b"sk-bob", 5)
        for key in bob:
            await store.set(Affinity(key, B, "v1", 1.0), TTL)
        alice = tenant_keys(b"sk-alice", 400)
        for n, key in enumerate(alice):
            await store.compare_and_set(key, None, Affinity(key, A, "v1", float(n)), TTL)
        assert [await store.get(k) is not None for k in bob] == [True] * 5
        counts = await store.counts()
        assert counts[B] == 5 and 100 <= counts[A] <= 160, counts
        kept = {a.session_key for a in await store.sessions_of(A)}
        assert kept <= set(alice) and alice[-1] in kept
    finally:
        await store.close()
