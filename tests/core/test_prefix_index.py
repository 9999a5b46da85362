"""The prefix index: longest-prefix lookups, per-worker and global bounds, feedback."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.core.prefix_index import PrefixIndex, PrefixIndexConfig

from .policies.tables import chain


def small(**fields: float) -> PrefixIndex:
    return PrefixIndex(PrefixIndexConfig(**fields))  # type: ignore[arg-type]


def assert_consistent(index: PrefixIndex) -> None:
    """Every worker's LRU entries and the block -> workers masks describe the same sets."""
    rebuilt: dict[int, int] = {}
    for worker, lru in index._lru.items():
        bit = 1 << index._bit[worker]
        for h in lru:
            rebuilt[h] = rebuilt.get(h, 0) | bit
    assert rebuilt == index._holders


def test_match_reports_each_workers_leading_depth() -> None:
    index = PrefixIndex()
    index.insert("a", chain(1, 6))
    index.insert("b", chain(1, 3))
    index.insert("c", chain(2, 4))
    assert index.match(chain(1, 8)) == {"a": 6, "b": 3}
    assert index.match(chain(2, 2)) == {"c": 2}
    assert index.match(chain(3, 5)) == {}
    assert index.match(()) == {}
    assert index.match_worker(chain(1, 8), "a") == 6


def test_a_gap_in_the_chain_ends_the_match() -> None:
    index = PrefixIndex()
    index.insert("a", chain(1, 2))
    index.insert("a", (1000, 1001, 9999, 1003))
    assert index.match(chain(1, 4)) == {"a": 2}


def test_per_worker_capacity_evicts_least_recent_chain_tail_first() -> None:
    index = small(default_worker_blocks=5, min_worker_blocks=1)
    index.insert("a", chain(1, 3))
    index.insert("a", chain(2, 3))
    assert index.worker_blocks("a") == 5
    # Group 1 was used least recently; its tail went first, its head survives.
    assert index.match(chain(1, 3)) == {"a": 2}
    assert index.match(chain(2, 3)) == {"a": 3}
    assert_consistent(index)


def test_reuse_refreshes_a_chain() -> None:
    index = small(default_worker_blocks=6, min_worker_blocks=1)
    index.insert("a", chain(1, 3))
    index.insert("a", chain(2, 3))
    index.insert("a", chain(1, 3))
    index.insert("a", chain(3, 3))
    assert index.match(chain(1, 3)) == {"a": 3}
    assert index.match(chain(2, 3)) == {}


def test_capacity_follows_the_workers_kv_capacity() -> None:
    index = small(block_chars=256, chars_per_token=4.0, default_worker_blocks=1000)
    index.set_kv_capacity("a", 64 * 50)  # 64 tokens per block -> 50 blocks, kept twice over
    index.set_kv_capacity("b", None)
    assert index.capacity("a") == 100
    assert index.capacity("b") == 1000
    for group in range(30):
        index.insert("a", chain(group, 4))
    assert index.worker_blocks("a") == 100
    exact = small(block_chars=256, chars_per_token=4.0, kv_overcommit=1.0)
    exact.set_kv_capacity("a", 64 * 50)
    assert exact.capacity("a") == 50


def test_fill_is_the_kv_cache_share_not_the_overcommitted_index_share() -> None:
    """The index keeps twice the KV capacity; its fill says when the cache itself is full."""
    index = small(block_chars=256, chars_per_token=4.0)
    index.set_kv_capacity("a", 64 * 50)  # 50 blocks of KV, 100 remembered
    assert index.fill("a") == 0.0
    for group in range(5):
        index.insert("a", chain(group, 5))
    assert index.fill("a") == pytest.approx(0.5)  # 25 blocks: half the cache
    for group in range(5, 10):
        index.insert("a", chain(group, 5))
    assert index.fill("a") == 1.0  # 50 blocks: the cache is full
    for group in range(10, 20):
        index.insert("a", chain(group, 5))
    assert index.fill("a") == 1.0  # remembered past the cache: still full, not more


def test_coarse_blocks_weigh_what_they_cover() -> None:
    """Past ``fine_blocks`` a block is ``coarse_factor`` fine ones wide, and counts so."""
    index = small(default_worker_blocks=40, fine_blocks=4, coarse_factor=8, min_worker_blocks=1)
    index.insert("a", chain(1, 6))  # 4 fine + 2 coarse = 4 + 16 units
    assert (index.worker_blocks("a"), index.worker_weight("a")) == (6, 20)
    assert index.depth_chars(6) == (4 + 2 * 8) * 256
    index.insert("a", chain(2, 6))  # 40 units: full
    index.insert("a", chain(3, 2))  # 42 units: the oldest chain's last (coarse) block goes
    assert index.worker_weight("a") == 34
    assert index.match(chain(3, 2)) == {"a": 2}
    assert index.match(chain(2, 6)) == {"a": 6}
    assert index.match(chain(1, 6)) == {"a": 5}


def test_global_bound_shares_memory_between_workers() -> None:
    index = small(default_worker_blocks=1000, max_total_blocks=100, min_worker_blocks=1)
    for w in range(10):
        for group in range(20):
            index.insert(f"w{w}", chain(group + 100 * w, 5))
    assert len(index) <= 100
    assert all(index.worker_blocks(f"w{w}") <= 10 for w in range(10))
    assert_consistent(index)


def test_removing_a_worker_forgets_it_and_frees_its_bit() -> None:
    index = PrefixIndex()
    index.insert("a", chain(1, 4))
    index.insert("b", chain(1, 4))
    index.remove_worker("a")
    assert index.match(chain(1, 4)) == {"b": 4}
    assert "a" not in set(index.workers())
    index.insert("c", chain(2, 2))
    assert index.match(chain(2, 2)) == {"c": 2}
    index.remove_worker("b")
    index.remove_worker("c")
    index.remove_worker("never-seen")
    assert len(index) == 0
    assert index.distinct_blocks() == 0


def test_a_match_names_whoever_holds_a_mask_now() -> None:
    """``match`` keeps a holder mask's workers named: a caller's changes to an answer, and
    a bit freed and taken by another worker, do not reach later answers."""
    index = PrefixIndex()
    index.insert("a", chain(1, 4))
    found = index.match(chain(1, 4))
    found["x"] = 9
    assert index.match(chain(1, 4)) == {"a": 4}
    index.remove_worker("a")
    index.insert("b", chain(1, 4))  # a's bit: the same mask
    assert index.match(chain(1, 4)) == {"b": 4}


def test_far_fewer_cached_tokens_than_predicted_shrinks_the_workers_share() -> None:
    index = small(default_worker_blocks=100, min_worker_blocks=1, miss_decrease=0.5)
    index.note_routed("r1", "a", chain(1, 10))
    index.note_routed("r2", "a", chain(1, 10))  # predicted: 10 blocks cached
    assert (
        index.note_usage("r2", "a", prompt_chars=2560, prompt_tokens=640, cached_tokens=0) is False
    )
    assert index.capacity("a") == 50
    index.note_routed("r3", "a", chain(1, 10))
    hit = index.note_usage("r3", "a", prompt_chars=2560, prompt_tokens=640, cached_tokens=600)
    assert hit is True
    assert index.capacity("a") > 50


def test_usage_without_a_prediction_teaches_nothing() -> None:
    index = small(default_worker_blocks=100)
    index.note_routed("r1", "a", chain(1, 10))  # nothing cached yet: predicted 0
    assert index.note_usage("r1", "a", 2560, 640, 0) is None
    assert index.note_usage("unknown", "a", 2560, 640, 0) is None
    assert index.capacity("a") == 100


def test_pending_predictions_are_bounded() -> None:
    index = small(max_pending=3)
    for i in range(10):
        index.note_routed(f"r{i}", "a", chain(1, 2))
    assert index.note_usage("r0", "a", 512, 128, 0) is None
    assert index.note_usage("r9", "a", 512, 128, 0) is False


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["insert", "remove", "kv", "usage"]),
            st.integers(0, 5),
            st.integers(0, 12),
            st.integers(1, 9),
        ),
        max_size=80,
    )
)
def test_random_operations_keep_every_bound(ops: list[tuple[str, int, int, int]]) -> None:
    index = small(default_worker_blocks=20, max_total_blocks=60, min_worker_blocks=2)
    for n, (op, w, group, length) in enumerate(ops):
        worker = f"w{w}"
        if op == "insert":
            index.note_routed(f"r{n}", worker, chain(group, length))
        elif op == "remove":
            index.remove_worker(worker)
        elif op == "kv":
            index.set_kv_capacity(worker, group * 64)
        else:
            index.note_usage(f"r{n - 1}", worker, 256 * length, 64 * length, group)
        assert len(index) <= 60
        for known in index.workers():
            assert index.worker_blocks(known) <= index.capacity(known)
    assert_consistent(index)


# 50 blocks of KV, 100 remembered: a block is likely resident while at most 75 blocks
# (``resident_turnover`` = 1.5 capacities) were sent to the worker after it was last
# sent. Chain 1's 10 blocks are inserted last block first, so its block i is i blocks
# older than its head; ``later`` blocks of other chains follow.
@pytest.mark.parametrize(
    ("later", "remembered", "resident"),
    [
        (0, 10, 10),
        (60, 10, 10),  # its tail (block 9) is 69 blocks old: still resident
        (70, 10, 6),  # blocks 6-9 are 76-79 old: likely evicted, still remembered
        (80, 10, 0),
        (95, 5, 0),  # past what is remembered: the tail is forgotten too
    ],
)
def test_resident_depth_cuts_claims_older_than_the_kv_turnover(
    later: int, remembered: int, resident: int
) -> None:
    index = small(block_chars=256, chars_per_token=4.0)
    index.set_kv_capacity("a", 64 * 50)
    index.insert("a", chain(1, 10))
    for group in range(later // 5):
        index.insert("a", chain(100 + group, 5))
    depth = index.match_worker(chain(1, 10), "a")
    assert depth == remembered
    assert index.resident_depth(chain(1, 10), "a", depth) == resident
    assert index.resident_depth(chain(1, 10), "a", 3) == min(3, resident)
    assert index.resident_depth(chain(1, 10), "b", 10) == 0  # a worker it never saw
    assert_consistent(index)


def test_sending_a_prefix_again_makes_it_resident_again() -> None:
    index = small(block_chars=256, chars_per_token=4.0)
    index.set_kv_capacity("a", 64 * 50)
    index.insert("a", chain(1, 10))
    for group in range(16):
        index.insert("a", chain(100 + group, 5))
    index.insert("a", chain(1, 4))  # a stranger sharing the first 4 blocks
    assert index.match_worker(chain(1, 10), "a") == 10
    assert index.resident_depth(chain(1, 10), "a", 10) == 4
    # Re-sent blocks add no weight to the share, and resident ones do not age the clock.
    index.insert("a", chain(1, 10))
    assert index.resident_depth(chain(1, 10), "a", 10) == 10
    # Cut at a given turnover (1 capacity = 50 blocks): the head only.
    assert index.resident_depth(chain(1, 10), "a", 10, turnover=1.0) == 10


def test_resending_an_evicted_prefix_ages_what_came_before_it() -> None:
    """A claim older than the KV capacity is recomputed when sent again: the engine
    allocates it anew and its LRU evicts older blocks for it, so the index's clock
    moves as for new blocks, and what was young before it ages."""
    index = small(block_chars=256, chars_per_token=4.0)
    index.set_kv_capacity("a", 64 * 50)
    index.insert("a", chain(1, 10))
    index.insert("a", chain(2, 40))
    index.insert("a", chain(3, 20))  # chain 1 is now 60-69 blocks old: past 50
    # Chain 2's block i is 20 + i blocks old, 30 + i once chain 1 comes back.
    assert index.resident_depth(chain(2, 40), "a", 40, turnover=1.0) == 31
    index.insert("a", chain(1, 10))
    assert index.resident_depth(chain(2, 40), "a", 40, turnover=1.0) == 21
    assert index.resident_depth(chain(1, 10), "a", 10, turnover=1.0) == 10
    index.insert("a", chain(3, 20))  # young (resident): sending it again moves nothing
    assert index.resident_depth(chain(2, 40), "a", 40, turnover=1.0) == 21


# Misses shrink what the index remembers (``_scale``), not how long the engine keeps a
# block: with the KV capacity known (50 blocks), the age cut stays at 1.5 capacities
# whatever the feedback; unknown, the index's own (scaled) capacity stands in for it.
@pytest.mark.parametrize(
    ("known", "misses", "resident"),
    [
        (True, 0, 10),
        (True, 3, 10),  # scale 0.34: remembers 34 blocks, still cuts at 75 old
        (False, 0, 10),  # default_worker_blocks=100 remembered: turnover 50, cut 75
        (False, 3, 6),  # scale 0.34: turnover 17, cut at 25; block i is 20 + i old
    ],
)
def test_the_age_cut_follows_the_kv_capacity_not_the_miss_feedback(
    known: bool, misses: int, resident: int
) -> None:
    index = small(block_chars=256, chars_per_token=4.0, default_worker_blocks=100)
    if known:
        index.set_kv_capacity("a", 64 * 50)
    for n in range(misses):  # predicted 2 blocks, none cached: a miss each time
        index.note_routed(f"m{n}", "a", chain(200 + n, 2))
        index.note_routed(f"m{n}x", "a", chain(200 + n, 2))
        index.note_usage(f"m{n}x", "a", 512, 128, 0)
    index.insert("a", chain(1, 10))
    for group in range(4):
        index.insert("a", chain(100 + group, 5))
    assert index.kv_blocks("a") == pytest.approx(50 if known else 100 * 0.7**misses / 2, rel=0.05)
    assert index.match_worker(chain(1, 10), "a") == 10
    assert index.resident_depth(chain(1, 10), "a", 10) == resident


@given(
    chars=st.integers(min_value=0, max_value=200_000),
    fine=st.integers(min_value=1, max_value=64),
    coarse=st.integers(min_value=1, max_value=8),
)
def test_depth_for_chars_is_the_fewest_blocks_that_cover_them(
    chars: int, fine: int, coarse: int
) -> None:
    index = PrefixIndex(PrefixIndexConfig(fine_blocks=fine, coarse_factor=coarse))
    depth = index.depth_for_chars(chars)
    assert index.depth_chars(depth) >= chars
    assert depth == 0 or index.depth_chars(depth - 1) < chars
