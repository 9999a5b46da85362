"""Replays in which running requests pin their KV (``workload.pinned``), by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.workload.bound import capacity_reference
from kvgate.workload.pinned import pinned_reference, split_replay
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import SimRequest

from .strategies import PROMPTS, one_second_apart


def test_pinned_reference_keeps_what_running_requests_hold() -> None:
    codec = PromptCodec(4)
    # a (2 blocks) runs from 0 to 10; b (3 blocks) from 1 to 2; c repeats b at 3.
    # In a 3-block pool a still pins two blocks when b ends: b keeps one, its head
    # (a chain is released tail first), so c hits one block.
    requests = [
        SimRequest.of(0.0, "a", ((1, 8),), 1),
        SimRequest.of(1.0, "b", ((2, 12),), 1),
        SimRequest.of(3.0, "c", ((2, 12),), 1),
    ]
    spans = {"a": (0.0, 10.0, 0), "b": (1.0, 2.0, 0), "c": (3.0, 4.0, 0)}
    assert pinned_reference(requests, codec, 3, spans).cached_tokens == 4
    # Instantaneous, a's blocks are evicted instead: c hits b's two hittable blocks.
    assert capacity_reference(requests, codec, 3).cached_tokens == 8
    # A request without a span (refused) is left out.
    assert pinned_reference(requests, codec, 3, {"a": (0.0, 1.0, 0)}).requests == 1


def test_split_replay_keeps_each_workers_cache_apart() -> None:
    codec = PromptCodec(4)
    # b repeats a's prompt: on a's worker it hits a block, on another nothing.
    requests = [SimRequest.of(0.0, "a", ((1, 8),), 1), SimRequest.of(2.0, "b", ((1, 8),), 1)]
    same = {"a": (0.0, 1.0, 0), "b": (2.0, 3.0, 0)}
    apart = {"a": (0.0, 1.0, 0), "b": (2.0, 3.0, 1)}
    assert split_replay(requests, codec, [4, 4], same, "run").cached_tokens == 4
    assert split_replay(requests, codec, [4, 4], apart, "run").cached_tokens == 0
    # Placed on the pool that holds most of it, wherever the run put it.
    assert split_replay(requests, codec, [4, 4], apart, "greedy").cached_tokens == 4
    assert split_replay(requests, codec, [4, 4], apart, "partition").cached_tokens == 4
    with pytest.raises(ValueError, match="block"):
        split_replay(requests, codec, [4, 0], same, "run")


@settings(max_examples=60, deadline=None)
@given(PROMPTS, st.integers(0, 40))
def test_pinned_reference_of_instantaneous_requests_is_the_capacity_reference(
    prompts: list[list[tuple[int, int]]], extra: int
) -> None:
    codec = PromptCodec(4)
    requests = one_second_apart(prompts)
    spans = {r.request_id: (r.arrival, r.arrival, 0) for r in requests}
    capacity = 16 + extra  # room for any one request's chain and output
    assert (
        pinned_reference(requests, codec, capacity, spans).cached_tokens
        == capacity_reference(requests, codec, capacity).cached_tokens
    )


def test_partition_keeps_requests_behind_one_shared_prefix_together() -> None:
    codec = PromptCodec(4)
    # Two conversations behind prompt 1 (2 blocks), placed by the run on different
    # pools: neither hits. Partitioned, both go to the pool whose share prompt 1 is,
    # and the second hits the prompt there.
    requests = [
        SimRequest.of(0.0, "a", ((1, 8), (2, 8)), 1),
        SimRequest.of(2.0, "b", ((1, 8), (3, 8)), 1),
    ]
    spans = {"a": (0.0, 1.0, 0), "b": (2.0, 3.0, 1)}
    assert split_replay(requests, codec, [8, 8], spans, "run").cached_tokens == 0
    assert split_replay(requests, codec, [8, 8], spans, "partition").cached_tokens == 8
