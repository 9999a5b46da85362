"""Checkpoints and the shared prefix state's pure rules (``kvgate.core.holders``)."""

from __future__ import annotations

import pytest

from kvgate.core.holders import (
    checkpoint_indices,
    continues,
    holder_writes,
    holders_from,
    lookup_keys,
    with_parent,
)
from kvgate.core.prefix import build_features


@pytest.mark.parametrize(
    ("blocks", "expected"),
    [
        (0, ()),
        (3, (2,)),  # short: only the last block
        (8, (3, 7)),
        (10, (3, 7, 9)),
        (70, (3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63, 65, 67, 69)),
    ],
)
def test_checkpoints_every_fourth_fine_block_every_second_coarse_and_the_last(
    blocks: int, expected: tuple[int, ...]
) -> None:
    assert checkpoint_indices(blocks, 64, 4) == expected


def test_a_later_turn_finds_the_checkpoints_its_earlier_turn_wrote() -> None:
    turn1 = {"model": "m", "prompt": "s" * 2048 + "my own question " * 200}
    turn2 = {"model": "m", "prompt": turn1["prompt"] + " and a follow-up" * 40}
    f1 = build_features(turn1, {}, request_id="1")
    f2 = build_features(turn2, {}, request_id="2")
    written = dict(
        holder_writes(
            lookup_keys(f1.prefix_hashes, f1.checkpoints, False), [None] * len(f1.checkpoints), "w7"
        )
    )
    keys = lookup_keys(f2.prefix_hashes, f2.checkpoints, False)
    found = [written.get(k) for k in keys]
    holders = holders_from(f2.checkpoints, found)
    # Every checkpoint of turn 1 but its (partial) last block is in turn 2's chain.
    assert holders == {"w7": f1.checkpoints[-2] + 1}
    assert continues(len(f2.prefix_hashes), holders)
    # A stranger behind the same 2 KiB opening shares only the opening's checkpoints.
    stranger = build_features({"model": "m", "prompt": "s" * 2048 + "x" * 3000}, {}, request_id="3")
    found = [
        written.get(k) for k in lookup_keys(stranger.prefix_hashes, stranger.checkpoints, False)
    ]
    theirs = holders_from(stranger.checkpoints, found)
    assert theirs == {"w7": 8}
    assert not continues(len(stranger.prefix_hashes), theirs)


def test_bound_requests_look_nothing_up_and_writes_skip_what_already_names_the_worker() -> None:
    assert lookup_keys((1, 2, 3), (0, 2), bound=True) == []
    assert lookup_keys((1, 2, 3), (0, 2), bound=False) == [1, 3]
    assert holder_writes([1, 3], ["a", None], "a") == [(3, "a")]
    assert holders_from((0, 2), ["a", "b"]) == {"a": 1, "b": 3}
    assert not continues(0, {})


def test_a_subagents_parent_holds_as_deep_as_any_holder() -> None:
    holders = {"a": 8, "b": 4}
    assert with_parent(holders, "b") == {"a": 8, "b": 8}
    assert with_parent(holders, "c") == {"a": 8, "b": 4, "c": 8}
    assert with_parent(holders, "a") is holders  # already the deepest
    assert with_parent(holders, None) is holders
    assert with_parent({}, "a") == {}  # nothing shared is known: no credit
