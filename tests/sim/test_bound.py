"""The infinite-cache bound on a workload small enough to compute by hand."""

from __future__ import annotations

import pytest

from kvgate.workload.bound import infinite_cache_bound
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import SimRequest


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
