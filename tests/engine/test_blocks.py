from array import array

import pytest
import xxhash

from kvgate.engine import blocks
from kvgate.engine.blocks import BlockPool, chain_hashes, token_bytes


def test_only_full_blocks_are_hashed() -> None:
    assert len(chain_hashes(list(range(47)), 16)) == 2
    assert len(chain_hashes(list(range(48)), 16)) == 3
    assert chain_hashes([], 16) == []


def test_hashes_are_chained() -> None:
    base = list(range(64))
    changed_first = [999, *base[1:]]
    changed_third = [*base[:40], 999, *base[41:]]
    h = chain_hashes(base, 16)
    assert all(a != b for a, b in zip(h, chain_hashes(changed_first, 16), strict=True))
    h3 = chain_hashes(changed_third, 16)
    assert h3[:2] == h[:2]
    assert h3[2:] != h[2:]


def test_same_block_at_another_position_hashes_differently() -> None:
    block = list(range(16))
    h = chain_hashes(block * 2, 16)
    assert h[0] != h[1]


def test_tokens_pack_as_an_int64_array_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocks, "_MAX_PACKERS", 3)
    for tokens in ([], [7], [0, -1, 2**40, 262_143] * 5, list(range(4099)), (5,) * 17):
        assert token_bytes(tokens) == array("q", tokens).tobytes()
    assert len(blocks._PACKERS) <= 3
    tokens = list(range(100, 164))
    keys, prev = [], 0
    for start in range(0, 64, 16):  # the hashes of array's bytes, as before
        prev = xxhash.xxh3_64_intdigest(array("q", tokens[start : start + 16]).tobytes(), prev)
        keys.append(prev)
    assert chain_hashes(tokens, 16) == keys


def test_bad_block_size() -> None:
    with pytest.raises(ValueError):
        chain_hashes([1, 2, 3], 0)


def test_pool_counts_free_in_use_and_evictable() -> None:
    pool = BlockPool(10)
    pool.make_room(3)
    for block in (1, 2, 3):
        pool.insert(block)
    pool.private += 2
    assert (pool.num_free, pool.num_in_use, pool.num_evictable) == (5, 5, 0)
    pool.release([3, 2])
    assert (pool.num_free, pool.num_in_use, pool.num_evictable) == (5, 3, 2)
    assert pool.available() == 7


def test_pool_evicts_least_recently_freed_first() -> None:
    pool = BlockPool(4)
    for block in (1, 2, 3, 4):
        pool.insert(block)
    pool.release([2])
    pool.release([4, 1])
    pool.release([3])
    assert pool.evictable_hashes() == [2, 4, 1, 3]
    pool.make_room(2)
    assert set(pool.refs) == {1, 3}
    assert pool.evictions == 2


def test_ref_protects_a_block_from_eviction() -> None:
    pool = BlockPool(2)
    pool.insert(1)
    pool.insert(2)
    pool.release([1, 2])
    pool.ref(1)
    pool.make_room(1)
    assert set(pool.refs) == {1}
    assert pool.match([1, 2], 2) == 1


def test_shared_blocks_are_reference_counted() -> None:
    pool = BlockPool(4)
    pool.insert(7)
    pool.insert(7)  # a second request computing the same block shares it
    assert pool.refs[7] == 2
    pool.release([7])
    assert pool.num_evictable == 0
    pool.release([7])
    assert pool.num_evictable == 1


def test_discard_only_takes_unreferenced_blocks() -> None:
    pool = BlockPool(4)
    pool.insert(1)
    pool.insert(2)
    pool.release([2])
    assert not pool.discard(1)
    assert pool.discard(2)
    assert not pool.discard(3)
    assert pool.num_free == 3


def test_promote_turns_a_private_block_into_a_cached_one() -> None:
    pool = BlockPool(4)
    pool.private = 1
    pool.promote(9)
    assert pool.private == 0
    assert pool.refs[9] == 1


def test_on_evict_sees_each_evicted_block() -> None:
    seen: list[int] = []
    pool = BlockPool(2, on_evict=seen.append)
    pool.insert(1)
    pool.insert(2)
    pool.release([2, 1])
    pool.make_room(2)
    assert seen == [2, 1]
    assert pool.clear_evictable() == 0


def test_chain_hashes_are_each_block_seeded_with_the_one_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keys the exact index matches events by: unchanged by how blocks are cut out
    (``whole_blocks``' cached splitters, started over past their bound)."""
    monkeypatch.setattr(blocks, "_MAX_PACKERS", 2)
    for count in (0, 1, 15, 16, 17, 33, 64, 257, 600):
        tokens = [(i * 7919) % 262_144 for i in range(count)]
        for size in (1, 3, 16):
            keys, prev = [], 0
            for start in range(0, count - size + 1, size):
                prev = xxhash.xxh3_64_intdigest(token_bytes(tokens[start : start + size]), prev)
                keys.append(prev)
            assert chain_hashes(tokens, size) == keys
            assert chain_hashes(tuple(tokens), size) == keys
    assert len(blocks._SPLITTERS) <= 2
