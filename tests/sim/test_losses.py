"""Where a placement's hits were lost (``workload.losses``), by hand and against the replays."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.workload.bound import capacity_reference
from kvgate.workload.losses import CAUSES, losses
from kvgate.workload.pinned import pinned_reference, split_replay
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import SimRequest

from .strategies import PROMPTS, one_second_apart


def test_each_lost_token_is_put_down_to_where_its_block_was() -> None:
    codec = PromptCodec(4)
    # a caches prompt 1 (2 blocks, 8 tokens) on pool 0; b repeats it on pool 1: held
    # elsewhere. c (prompt 2) on pool 1 evicts b's blocks there (2-block pools); d
    # repeats prompt 1 on pool 1 again: evicted there, though pool 0 still holds it.
    requests = [
        SimRequest.of(0.0, "a", ((1, 9),), 1),
        SimRequest.of(2.0, "b", ((1, 9),), 1),
        SimRequest.of(4.0, "c", ((2, 9),), 1),
        SimRequest.of(6.0, "d", ((1, 9),), 1),
        SimRequest.of(8.0, "e", ((1, 9),), 1),
    ]
    spans = {
        "a": (0.0, 1.0, 0),
        "b": (2.0, 3.0, 1),
        "c": (4.0, 5.0, 1),
        "d": (6.0, 7.0, 1),
        "e": (8.0, 9.0, 1),
    }
    found = losses(requests, codec, [2, 2], spans, "run")
    # Every request's prompt is 9 tokens: 2 whole blocks hittable, 1 token always computed.
    assert found.prompt_tokens == 45
    assert found.tokens == {
        "hit": 8,  # e, on d's blocks
        "elsewhere": 16,  # b and d: pool 0 holds prompt 1
        "evicted_here": 0,
        "evicted_away": 0,
        "new": 21,  # a's and c's 8 each, and the last token of each of the five
    }
    assert sum(found.points().values()) == pytest.approx(100.0)
    # Pool 0 evicted after a: d finds prompt 1 on no pool, but once on its own.
    spans["b"] = (2.0, 3.0, 0)
    spans["c"] = (4.0, 5.0, 0)
    found = losses(requests, codec, [2, 2], spans, "run")
    assert found.tokens["evicted_away"] == 8  # d on pool 1: prompt 1 was on pool 0 only
    assert found.tokens["hit"] == 16  # b on pool 0, e on pool 1


def test_free_copies_let_two_pools_hold_one_prefix_for_the_room_of_one() -> None:
    codec = PromptCodec(4)
    # Prompt 1 (2 blocks) on both 3-block pools; then prompt 2 (2 blocks) on pool 0.
    # Each copy of prompt 1 costs a block: pool 0 holds 1 + 2 and keeps all of it,
    # where it paid 2 + 2 before and evicted prompt 1's tail (released tail first).
    requests = [
        SimRequest.of(0.0, "a", ((1, 9),), 0),
        SimRequest.of(2.0, "b", ((1, 9),), 0),
        SimRequest.of(4.0, "c", ((2, 9),), 0),
        SimRequest.of(6.0, "d", ((1, 9),), 0),
    ]
    spans = {
        "a": (0.0, 1.0, 0),
        "b": (2.0, 3.0, 1),
        "c": (4.0, 5.0, 0),
        "d": (6.0, 7.0, 0),
    }
    paid = losses(requests, codec, [3, 3], spans, "run")
    free = losses(requests, codec, [3, 3], spans, "run", free_copies=True)
    assert paid.tokens["hit"] == 4 and paid.tokens["elsewhere"] == 8 + 4
    assert free.tokens["hit"] == 8
    assert 0.0 < free.copies < 1.0


@settings(max_examples=60, deadline=None)
@given(PROMPTS, st.integers(0, 40), st.lists(st.integers(0, 2), min_size=30, max_size=30))
def test_the_replays_hit_as_the_references_and_split_replays_do(
    prompts: list[list[tuple[int, int]]], extra: int, workers: list[int]
) -> None:
    codec = PromptCodec(4)
    requests = one_second_apart(prompts)
    capacity = 16 + extra
    reference = losses(requests, codec, [capacity], None, "reference")
    assert reference.tokens["hit"] == capacity_reference(requests, codec, capacity).cached_tokens
    assert reference.tokens["elsewhere"] == reference.tokens["evicted_away"] == 0
    assert sum(reference.tokens.values()) == reference.prompt_tokens
    # Overlapping spans: each request runs 2.5 s, so up to three pin at once.
    spans = {r.request_id: (r.arrival, r.arrival + 2.5, workers[i]) for i, r in enumerate(requests)}
    pools = [capacity, capacity + 3, capacity]
    one = losses(requests, codec, pools, spans, "one")
    assert one.tokens["hit"] == pinned_reference(requests, codec, sum(pools), spans).cached_tokens
    for place in ("run", "partition"):
        found = losses(requests, codec, pools, spans, place)
        replayed = split_replay(requests, codec, pools, spans, place)
        assert found.tokens["hit"] == replayed.cached_tokens
        assert sum(found.tokens.values()) == found.prompt_tokens
        assert set(found.tokens) == set(CAUSES)
    # On one pool there are no copies: free_copies changes nothing.
    alone = {r.request_id: (r.arrival, r.arrival + 2.5, 0) for r in requests}
    assert (
        losses(requests, codec, pools, alone, "run", free_copies=True).tokens
        == losses(requests, codec, pools, alone, "run").tokens
    )


def test_a_replay_of_a_run_needs_its_spans_and_pools_of_some_room() -> None:
    codec = PromptCodec(4)
    requests = [SimRequest.of(0.0, "a", ((1, 9),), 1)]
    with pytest.raises(ValueError, match="spans"):
        losses(requests, codec, [4], None, "run")
    with pytest.raises(ValueError, match="block"):
        losses(requests, codec, [4, 0], {"a": (0.0, 1.0, 0)}, "run")
