"""``Openers``: which prefixes openings matched count as shared, and so may be warmed."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from kvgate.core.features import RequestFeatures
from kvgate.core.policies.warming import SHARED, Openers
from kvgate.core.prefix import build_features

BASE = build_features({"model": "m", "prompt": "x" * 4096}, {}, request_id="base")


def request(rid: str, chain: tuple[int, ...]) -> RequestFeatures:
    return dataclasses.replace(BASE, request_id=rid, prefix_hashes=chain)


def kept(openers: Openers) -> list[str]:
    return [o.request_id for o in openers.newest_first()]


def test_a_prefix_is_shared_once_a_second_opening_matches_it() -> None:
    openers = Openers(least_blocks=4)
    system = (1, 2, 3, 4, 5)
    openers.note(request("a", (*system, 10, 11)), depth=5)
    assert kept(openers) == []  # one match: as likely a conversation's own history
    openers.note(request("b", (*system, 20, 21)), depth=5)
    assert kept(openers) == ["a"]  # the first opening's body stands for the prefix
    assert [len(o.prefix_hashes) for o in openers.newest_first()] == [5]
    assert openers.ids() == ["a"]


def test_a_conversation_matching_its_own_growing_history_is_never_warmed() -> None:
    """A trace's turn the policy cannot follow matches its predecessor's chain, each
    turn ending deeper: no prefix is matched twice, so none is copied ahead."""
    openers = Openers(least_blocks=4)
    chain = tuple(range(100, 160))
    for turn, depth in enumerate(range(8, 60, 6)):
        openers.note(request(f"t{turn}", chain[: depth + 3]), depth=depth)
    assert kept(openers) == []
    assert len(openers.ids()) == 8  # kept, newest, in case a second opening comes


def test_short_matches_and_the_option_off_note_nothing() -> None:
    off, short = Openers(least_blocks=0), Openers(least_blocks=4)
    for openers in (off, short):
        for rid in ("a", "b", "c"):
            openers.note(request(rid, (1, 2, 3, 9)), depth=3)
    assert off.ids() == short.ids() == []


@given(
    st.lists(
        st.tuples(st.integers(0, 11), st.integers(4, 6)),  # (prefix id, its depth)
        max_size=60,
    )
)
def test_only_prefixes_matched_twice_are_offered_and_at_most_limit_are_kept(
    notes: list[tuple[int, int]],
) -> None:
    openers = Openers(least_blocks=4, limit=5)
    counts: dict[tuple[int, int], int] = {}
    order: list[tuple[int, int]] = []
    for i, (prefix, depth) in enumerate(notes):
        chain = (*(1000 * prefix + j for j in range(depth)), 10**6 + i)
        openers.note(request(f"r{i}", chain), depth=depth)
        key = (prefix, depth)
        if key in order:
            order.remove(key)
            counts[key] += 1
        else:
            counts[key] = 1
        order.append(key)
        if len(order) > 5:
            counts.pop(order.pop(0))
    expected = [k for k in reversed(order) if counts[k] >= SHARED]
    offered = [(o.prefix_hashes[0] // 1000, len(o.prefix_hashes)) for o in openers.newest_first()]
    assert offered == expected
    assert len(openers.ids()) == len(order) <= 5
