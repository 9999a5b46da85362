"""What one tenant's prompts can make the store hold of the shared prefix state.

The prefix holders (``core.holders``: block -> the worker it was last sent to) are shared by
every tenant by design, a common opening being anyone's evidence; but each block written is
counted against the tenant whose request wrote it (``RequestFeatures.tenant``). A client
sending ever new prompts grew Redis by every checkpoint of each for their TTL, and evicted
everyone's evidence from the memory store; now past its bound only its own oldest go, and
never a block another tenant has written since.
"""

from __future__ import annotations

import redis

from kvgate.core.session import tenant_tag
from kvgate.store import MemoryStore, RedisStore
from kvgate.store.base import AffinityStore
from kvgate.store.holders import HolderTable

from .harness import FakeClock

A = "http://10.0.0.1:8000"
B = "http://10.0.0.2:8000"
ALICE, BOB = tenant_tag(b"sk-alice"), tenant_tag(b"sk-bob")
TTL = 60.0
PATIENT = {"socket_timeout": 1.0, "connect_timeout": 2.0}
BOBS = [(10_000 + i, B) for i in range(10)]
ALICES = [(20_000 + i, A) for i in range(500)]


async def flood(store: AffinityStore, clock: FakeClock | None = None) -> None:
    """Bob writes 10 blocks; Alice 500, five a request (a few checkpoints each)."""
    await store.set_holders(BOBS, TTL, BOB)
    for low in range(0, len(ALICES), 5):
        if clock is not None:
            clock.advance(0.01)
        await store.set_holders(ALICES[low : low + 5], TTL, ALICE)


async def held(store: AffinityStore, entries: list[tuple[int, str]]) -> list[int]:
    found = await store.get_holders([block for block, _ in entries])
    return [block for (block, worker), got in zip(entries, found, strict=True) if got == worker]


async def test_a_flood_of_prompts_keeps_other_tenants_evidence_in_memory() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock, max_holders=1000, max_holders_per_scope=30)
    await flood(store, clock)
    assert await held(store, BOBS) == [b for b, _ in BOBS]
    assert await held(store, ALICES) == [b for b, _ in ALICES[-30:]]
    assert (store.holders.held_by(BOB), store.holders.held_by(ALICE), len(store.holders)) == (
        10,
        30,
        40,
    )


def test_a_full_table_gives_each_tenant_its_even_share_unbounded_per_tenant() -> None:
    """No per-tenant bound: a full table still takes a flooding tenant's own oldest once it
    holds its even share; alone, the table is the least-recently-written LRU it was."""
    table = HolderTable(max_entries=100)
    table.set_many(BOBS, 0.0, TTL, BOB)
    for low in range(0, len(ALICES), 5):
        table.set_many(ALICES[low : low + 5], 0.0, TTL, ALICE)
    assert table.get_many([b for b, _ in BOBS], 1.0) == [B] * 10
    assert (table.held_by(ALICE), len(table)) == (90, 100)
    alone = HolderTable(max_entries=3)
    alone.set_many([(1, A), (2, A), (3, A)], 0.0, TTL)
    alone.set_many([(1, B), (4, A)], 0.0, TTL)  # 1 written again: 2 is the oldest
    assert alone.get_many([1, 2, 3, 4], 1.0) == [B, None, A, A]


async def test_a_flood_of_prompts_keeps_other_tenants_evidence_in_redis(redis_url: str) -> None:
    store = RedisStore(redis_url, prefix="kv:", max_holders_per_scope=30, **PATIENT)
    try:
        shared = [(30_000, A)]  # a common opening: Alice's first, then Bob's
        await store.set_holders(shared, TTL, ALICE)
        await store.set_holders([(30_000, B)], TTL, BOB)
        await flood(store)
        assert await held(store, BOBS) == [b for b, _ in BOBS]
        assert await held(store, ALICES) == [b for b, _ in ALICES[-30:]]
        # Bob's write of the shared block is his evidence: Alice's bound leaves it.
        assert await store.get_holders([30_000]) == [B]
        with redis.Redis.from_url(redis_url) as client:
            assert sum(1 for _ in client.scan_iter("kv:pfx:*")) == 41
            sets = {k.decode(): client.zcard(k) for k in client.scan_iter("kv:pt:*")}
            assert sets == {f"kv:pt:{BOB}": 11, f"kv:pt:{ALICE}": 30}
        assert store.local.holders.held_by(ALICE) == 30  # the local mirror is bounded alike
    finally:
        await store.close()


async def test_coalesced_writes_of_several_tenants_are_bounded_each(redis_url: str) -> None:
    """``set_holders_soon`` batches many requests' writes into one round trip: each
    tenant's still count against its own bound."""
    store = RedisStore(redis_url, prefix="kv:", max_holders_per_scope=30, **PATIENT)
    try:
        store.set_holders_soon(BOBS, TTL, lambda: None, BOB)
        for low in range(0, len(ALICES), 5):
            store.set_holders_soon(ALICES[low : low + 5], TTL, lambda: None, ALICE)
        await store._holder_writes._flush()
        assert await held(store, BOBS) == [b for b, _ in BOBS]
        assert len(await held(store, ALICES)) == 30
    finally:
        await store.close()


async def test_a_flood_of_prompts_is_bounded_on_every_shard_of_a_cluster(cluster_url: str) -> None:
    store = RedisStore(cluster_url, max_holders_per_scope=160, **PATIENT)  # 10 a shard
    try:
        await flood(store)
        assert await held(store, BOBS) == [b for b, _ in BOBS]
        kept = await held(store, ALICES)
        assert 100 <= len(kept) <= 160 and ALICES[-1][0] in kept, len(kept)
    finally:
        await store.close()
