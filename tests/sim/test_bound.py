"""The infinite-cache bound on a workload small enough to compute by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.workload.bound import capacity_reference, infinite_cache_bound
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import SimRequest

from .strategies import PROMPTS, one_second_apart


def test_bound_on_a_hand_computed_workload() -> None:
    codec = PromptCodec(4)
    requests = [
        # 8 tokens, nothing seen yet: 0 cached.
        SimRequest.of(0.0, "a", ((1, 8),), 1),
        # Segment 1's two blocks were seen: 8 of 12 tokens cached.
        SimRequest.of(1.0, "b", ((1, 8), (2, 4)), 1),
        # All 8 tokens seen, but the last token is always computed: one block, 4 tokens.
        SimRequest.of(2.0, "c", ((1, 8),), 1),
        # Different content: 0 of 6.
        SimRequest.of(3.0, "d", ((5, 6),), 1),
        # Segment 2 after segment 1 was seen, and so was b's reply: 12 + 4 of 17.
        SimRequest.of(4.0, "e", ((1, 8), (2, 4), (3, 5)), 1),
    ]
    requests[1] = SimRequest.of(1.0, "b", ((1, 8), (2, 4)), 4, reply=(3, 4))
    bound = infinite_cache_bound(requests, codec)
    assert bound.requests == 5
    assert bound.prompt_tokens == 8 + 12 + 8 + 6 + 17
    assert bound.cached_tokens == 0 + 8 + 4 + 0 + 16
    assert bound.hit_rate == pytest.approx(28 / 51)


def test_bound_without_reuse_is_zero() -> None:
    codec = PromptCodec(16)
    requests = [SimRequest.of(float(i), f"r{i}", ((i, 100),), 1) for i in range(10)]
    assert infinite_cache_bound(requests, codec).hit_rate == 0.0


def test_capacity_reference_on_a_hand_computed_lru() -> None:
    codec = PromptCodec(4)
    # 2-block prompts (at most 1 block can hit: the last token is computed).
    requests = [
        SimRequest.of(0.0, "a", ((1, 8),), 1),
        SimRequest.of(1.0, "b", ((2, 8),), 1),
        # With room for 4 blocks, c evicts a's two blocks...
        SimRequest.of(2.0, "c", ((3, 8),), 1),
        # ...so a's repeat misses, and evicts b's...
        SimRequest.of(3.0, "d", ((1, 8),), 1),
        # ...while c's blocks are still there: 4 tokens cached.
        SimRequest.of(4.0, "e", ((3, 8),), 1),
    ]
    small = capacity_reference(requests, codec, 4)
    assert small.capacity_blocks == 4
    assert small.cached_tokens == 4
    infinite = infinite_cache_bound(requests, codec)
    assert infinite.cached_tokens == 4 + 4  # d and e each hit their first block
    assert capacity_reference(requests, codec, 6).cached_tokens == 4 + 4


def test_capacity_reference_evicts_a_chain_tail_first() -> None:
    codec = PromptCodec(4)
    # A 3-block prompt, then a 1-block stranger in a 3-block cache: the stranger
    # evicts the first prompt's tail, so a repeat still hits the first two blocks.
    requests = [
        SimRequest.of(0.0, "a", ((1, 12), (9, 1)), 1),
        SimRequest.of(1.0, "b", ((2, 4),), 1),
        SimRequest.of(2.0, "c", ((1, 12), (9, 1)), 1),
    ]
    assert capacity_reference(requests, codec, 3).cached_tokens == 8


def test_capacity_reference_counts_the_outputs_the_engines_cache() -> None:
    codec = PromptCodec(4)
    # a's 3 blocks, then b's 1-block prompt with an 8-token answer no one re-sends
    # (2 more blocks): in a 4-block cache b evicts a's last two blocks, so a's
    # repeat hits its first block only.
    requests = [
        SimRequest.of(0.0, "a", ((1, 12),), 1),
        SimRequest.of(1.0, "b", ((2, 4),), 8),
        SimRequest.of(2.0, "c", ((1, 12),), 1),
    ]
    assert capacity_reference(requests, codec, 4).cached_tokens == 4
    # With one token of output b takes one block, and a's two hittable blocks stay.
    short = [*requests[:1], SimRequest.of(1.0, "b", ((2, 4),), 1), requests[2]]
    assert capacity_reference(short, codec, 4).cached_tokens == 8


@settings(max_examples=60, deadline=None)
@given(PROMPTS, st.integers(1, 40))
def test_capacity_reference_is_at_most_the_bound_and_grows_with_capacity(
    prompts: list[list[tuple[int, int]]], capacity: int
) -> None:
    codec = PromptCodec(4)
    requests = one_second_apart(prompts)
    bound = infinite_cache_bound(requests, codec)
    smaller = capacity_reference(requests, codec, capacity)
    larger = capacity_reference(requests, codec, capacity + 8)
    assert smaller.cached_tokens <= larger.cached_tokens <= bound.cached_tokens
    roomy = capacity_reference(requests, codec, 10_000)
    assert roomy.cached_tokens == bound.cached_tokens  # a cache that never fills is the bound


def test_capacity_reference_needs_a_block() -> None:
    with pytest.raises(ValueError, match="block"):
        capacity_reference([], PromptCodec(4), 0)
