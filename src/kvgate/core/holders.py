"""Shared prefix state: which worker some replica last sent a prefix block to.

Gateway replicas must agree on where a headerless conversation lives without a
key derived from text that strangers share. They agree on the conversation's own
blocks instead: after routing a request, the driver writes ``block hash ->
worker`` into the shared store for a few *checkpoint* blocks of its chain
(``RequestFeatures.checkpoints``: every ``stride``-th fine block, every second
coarse block, and the last block), and before routing it reads the same
checkpoints of the next request in one pipelined ``get_many``. A conversation's
next turn extends its chain, so it finds the checkpoints its earlier turn wrote,
whichever replica routed it, and the policy learns "worker W holds at least d
blocks of this chain" (``RouteContext.holders``).

A shared opening's checkpoints are written by everyone, so they name whichever
worker last got one: that is evidence of a cached block (true), never a binding,
and the policy weighs it like its own index, by the tokens it saves.

Everything here is pure; the store and the drivers do the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvgate.types import BlockHash, WorkerId

HOLDER_TAG = "pfx:"
"""Leading tag of prefix-holder keys in a store, apart from session keys."""

HOLDER_TTL_S = 600.0
"""How long a holder binding lives at most: KV caches turn over within minutes, and a
shared store should not keep evidence of blocks long evicted."""


_UNEVEN = "the checkpoints and what the store found differ in length"
"""``zip(strict=True)``'s check, made up front: on 3.11 ``zip`` with any keyword parses
it on every call, some 1.6x a two-item ``zip``'s whole cost (once or twice a request)."""


def checkpoint_indices(blocks: int, fine_blocks: int, stride: int) -> tuple[int, ...]:
    """Indices into a chain of ``blocks`` hashes whose bindings replicas share.

    Every ``stride``-th fine block, every second coarse block (each is already
    ``coarse_factor`` fine blocks wide), and the last block (an exact repeat of
    a prompt finds where it went).
    """
    if blocks <= 0:
        return ()
    fine = fine_blocks if fine_blocks < blocks else blocks
    picks = [i for i in range(stride - 1, fine, stride)]
    picks.extend(range(fine_blocks + 1, blocks, 2))
    if not picks or picks[-1] != blocks - 1:
        picks.append(blocks - 1)
    return tuple(picks)


def lookup_keys(
    hashes: Sequence[BlockHash], checkpoints: Sequence[int], bound: bool
) -> list[BlockHash]:
    """The blocks a driver looks up for a request: none when a session binding leads it."""
    return [] if bound else [hashes[i] for i in checkpoints]


def holder_keys(hashes: Sequence[BlockHash], checkpoints: Sequence[int]) -> list[BlockHash]:
    """The block hashes to look up for a request, in checkpoint order."""
    return [hashes[i] for i in checkpoints]


def holders_from(checkpoints: Sequence[int], found: Sequence[WorkerId | None]) -> dict[str, int]:
    """Per worker, the deepest checkpoint (as a depth in blocks) bound to it."""
    if len(checkpoints) != len(found):
        raise ValueError(_UNEVEN)
    depths: dict[WorkerId, int] = {}
    for index, worker in zip(checkpoints, found):  # noqa: B905 - checked above
        if worker is not None and depths.get(worker, 0) < index + 1:
            depths[worker] = index + 1
    return depths


def holder_writes(
    keys: Sequence[BlockHash], found: Sequence[WorkerId | None], worker: WorkerId
) -> list[tuple[BlockHash, WorkerId]]:
    """The bindings to write after routing to ``worker``: checkpoints not already naming it."""
    if len(keys) != len(found):
        raise ValueError(_UNEVEN)
    return [(key, worker) for key, seen in zip(keys, found) if seen != worker]  # noqa: B905


def continues(blocks: int, holders: Mapping[WorkerId, int]) -> bool:
    """True when some worker holds at least half of a ``blocks``-long chain, by the store.

    That is a headerless conversation's later turn (its earlier turn covers most of
    the chain), whose cache is resident: memory pressure treats it like a request
    of a known session, not like new work. A stranger behind a shared opening
    matches only the opening, a small part of its chain.
    """
    return bool(blocks) and bool(holders) and 2 * max(holders.values()) >= blocks


def with_parent(holders: Mapping[WorkerId, int], parent: WorkerId | None) -> Mapping[WorkerId, int]:
    """``holders`` with a subagent's parent's worker holding as deep as any worker does.

    A subagent's prompt opens with what its parent's does (the tool preamble, the task
    it was handed), and the parent's worker holds that and the parent's own context: of
    the workers holding the shared prefix, the parent's is at least as deep. The policy
    then weighs it like any holder, by the prefill it saves, so the subagent goes there
    unless that worker is the slower choice.
    """
    if parent is None or not holders:
        return holders
    deepest = max(holders.values())
    if holders.get(parent, 0) >= deepest:
        return holders
    return {**holders, parent: deepest}
