"""IndexResidency: the one residency ``default`` (in blocks) and ``ttft`` (in characters) read."""

from __future__ import annotations

import pytest

from kvgate.core.policies.caches import IndexResidency
from kvgate.core.policies.running import RunningBlocks
from kvgate.core.policy import Resident, RouteContext
from kvgate.core.prefix_index import PrefixIndex

from .tables import chain, ctx, fleet, request, worker

SNAPSHOT = fleet(worker("a"), worker("b"), worker("c"))


def residency() -> IndexResidency:
    """a was sent 10 blocks of the chain (the index), c runs a request on 6 of them."""
    index, running = PrefixIndex(), RunningBlocks()
    index.insert("a", chain(1, 10))
    running.add("c", chain(1, 6))
    return IndexResidency(index, running)


def told(chars: dict[str, int], exact: tuple[str, ...], holders: dict[str, int]) -> RouteContext:
    return RouteContext(SNAPSHOT, None, ctx(SNAPSHOT).rng, holders, Resident(chars, exact))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("chars", "exact", "holders", "blocks"),
    [
        ({}, (), {}, {"a": 10}),  # no events: the index
        ({}, (), {"b": 20}, {"a": 10, "b": 12}),  # the store's holders, cut at the chain
        ({"b": 700}, ("a", "b", "c"), {}, {"b": 2, "c": 6}),  # the engines' word, in flight
        ({"b": 700}, ("b", "c"), {"a": 11}, {"a": 11, "b": 2, "c": 6}),  # a publishes none
    ],
)
def test_matches_and_held_read_the_same_sources(
    chars: dict[str, int], exact: tuple[str, ...], holders: dict[str, int], blocks: dict[str, int]
) -> None:
    turn = request("t", hashes=chain(1, 12))
    cache = residency()
    assert cache.matches(turn, told(chars, exact, holders)) == blocks
    assert cache.told(turn, "b") == ("b" in exact)
    # In characters: an engine's word as told (700, not 2 whole blocks), the rest by block.
    held = {w: chars.get(w) or 256 * n for w, n in blocks.items()}
    assert cache.held(turn, told(chars, exact, holders)) == held
    assert cache.matches(turn, ctx(SNAPSHOT)) == {"a": 10}  # no ``Resident``: the index


def test_a_worker_the_index_meets_is_asked_again_for_the_same_publishers() -> None:
    """``IndexResidency`` remembers that every worker its index knows publishes events
    for one frozenset of publishers; a worker the index meets after that (it publishes
    none) has its claim looked up again, and one it forgets is dropped again."""
    turn, exact = request("t", hashes=chain(1, 12)), frozenset({"a", "b"})
    cache = residency()
    assert cache.matches(turn, told({"b": 700}, exact, {})) == {"b": 2}  # type: ignore[arg-type]
    cache.index.insert("c", chain(1, 4))  # c publishes no events: the index's claim
    assert cache.matches(turn, told({"b": 700}, exact, {})) == {"c": 4, "b": 2}  # type: ignore[arg-type]
    cache.index.remove_worker("c")
    assert cache.matches(turn, told({"b": 700}, exact, {})) == {"b": 2}  # type: ignore[arg-type]
