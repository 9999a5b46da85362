"""What each worker's cache holds of a request, and what a placement there would evict.

Two interfaces ``ttft`` reads, so better sources plug in without touching it (``default``
reads ``IndexResidency.matches``, the same answer in whole blocks of the chain):

- ``Residency.held(request, ctx)``: per worker, the characters of the request's prompt
  its cache holds (the leading part of its chain). ``IndexResidency`` answers from every
  source there is, best first: the engine itself where the worker publishes KV events
  (``ctx.resident``, read from the exact index by the driver: its word replaces every
  other claim on that worker; it is one step behind this replica's own, so the chains of
  requests in flight there count too: without them, siblings of a new shared prefix that
  arrived while its first request waited in the engine's queue all went elsewhere); this
  replica's approximate ``PrefixIndex`` (what was sent where, corrected by
  ``cached_tokens``); and the shared store's prefix state (``ctx.holders``).
- ``evicted_tokens(...)``: the predicted cost, in prefill tokens, of the blocks a placement's
  new KV pushes out of a worker's cache that later requests would have hit. KV reserved
  for sessions away on a tool call (``WorkerState.kv_reserved_tokens``, certain to come
  back) is an input: it is the oldest, so LRU evicts it first, and every evicted token of
  it is recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from collections.abc import Set as AbstractSet
from typing import Protocol

from kvgate.core.features import RequestFeatures
from kvgate.core.policies.running import RunningBlocks
from kvgate.core.policy import Resident, RouteContext
from kvgate.core.prefix_index import PrefixIndex
from kvgate.types import WorkerId


class Residency(Protocol):
    """Where a request's prompt is cached."""

    def held(self, request: RequestFeatures, ctx: RouteContext) -> dict[WorkerId, int]:
        """Characters of ``request``'s prompt each worker holds (workers holding none may
        be left out)."""
        ...

    def resident(self, request: RequestFeatures, worker: WorkerId) -> int | None:
        """Characters of ``request``'s prompt ``worker`` likely still holds, where that is
        less than ``held`` said of it (``None``: nothing to take back)."""
        ...


class IndexResidency:
    """``Residency`` from the engines' KV events, a policy's index and the store; in
    blocks of the request's chain too (``matches``: ``default``'s unit)."""

    def __init__(self, index: PrefixIndex, running: RunningBlocks) -> None:
        self.index = index
        self.running = running
        # The index's claims (blocks) on the last request looked up, the store's holders and
        # the workers publishing events (``resident``); the workers whose events told its
        # claims (``told``).
        self._claims: tuple[str, dict[WorkerId, int], Mapping[WorkerId, int], Collection[WorkerId]]
        self._claims = ("", {}, {}, ())
        self._told: tuple[str, Collection[WorkerId]] = ("", ())
        # ``_all_told``'s last answer: for which publishers, at which ``worker_changes``.
        self._all: tuple[Collection[WorkerId], int, bool] = ((), -1, False)

    def matches(self, request: RequestFeatures, ctx: RouteContext) -> dict[WorkerId, int]:
        """Blocks of the request's chain each worker holds: the deeper of the index's and
        the store's; for a worker that publishes KV events, the whole blocks its engine
        holds or the chains in flight there, deeper."""
        resident, holders = ctx.resident, ctx.holders
        if resident is None:
            return self._found(request, holders, ())
        hashes, exact = request.prefix_hashes, resident.exact
        self._told = (request.request_id, exact)
        # Where every worker the index or the store could name publishes events, their
        # claims would all be replaced by the engines' word: not looked up (~11 µs).
        found = {} if self._all_told(exact, holders) else self._found(request, holders, exact)
        found = exact_matches(found, resident, self.index.depth_within, len(hashes))
        for worker, depth in self.running.shared_depths(hashes, exact):
            if depth > found.get(worker, 0):
                found[worker] = depth
        return found

    def _all_told(self, exact: Collection[WorkerId], holders: Mapping[WorkerId, int]) -> bool:
        """Whether every worker the index or the store names is in ``exact`` (``_within``):
        with no store holders, remembered for one frozenset of publishers (the driver's,
        the same object while they stay the same) while the index knows the same workers
        (its ``worker_changes``): 64 workers checked each decision were ~10k instructions."""
        if holders or type(exact) is not frozenset:
            return _within(exact, self.index.known_workers(), holders.keys())
        seen, changes, answer = self._all
        version = self.index.worker_changes
        if seen is not exact or changes != version:
            answer = _within(exact, self.index.known_workers())
            self._all = (exact, version, answer)
        return answer

    def told(self, request: RequestFeatures, worker: WorkerId) -> bool:
        """Whether ``worker``'s claim on ``request`` (``matches``) is its engine's word."""
        rid, exact = self._told
        return rid == request.request_id and worker in exact

    def held(self, request: RequestFeatures, ctx: RouteContext) -> dict[WorkerId, int]:
        """``matches`` in characters, those of an engine's word as it told them."""
        resident, holders = ctx.resident, ctx.holders
        exact = resident.exact if resident is not None else ()
        if exact and self._all_told(exact, holders):
            found: dict[WorkerId, int] = {}  # as ``matches``: only the engines' word counts
            self._claims = ("", {}, {}, ())
        else:
            found = self._found(request, holders, exact)
        prompt, chars = request.prompt_chars, self.index.depth_chars
        # Most workers hold a chain to one of a few depths: one conversion a depth.
        cut = {d: c if (c := chars(d)) < prompt else prompt for d in set(found.values())}
        if resident is None:
            return {w: cut[d] for w, d in found.items()}
        held = {w: cut[d] for w, d in found.items() if w not in exact}
        for worker, told in resident.chars.items():
            if told:
                held[worker] = told if told < prompt else prompt
        for worker, depth in self.running.shared_depths(request.prefix_hashes, exact):
            flying = min(chars(depth), prompt)
            if flying > held.get(worker, 0):
                held[worker] = flying
        return held

    def _found(
        self, request: RequestFeatures, holders: Mapping[WorkerId, int], exact: Collection[WorkerId]
    ) -> dict[WorkerId, int]:
        """Blocks of the request's chain per worker: the index's match, or the store's
        holders' where deeper (the index's claims kept for ``resident``)."""
        hashes = request.prefix_hashes
        found = self.index.match(hashes) if hashes else {}
        self._claims = (request.request_id, found, holders, exact)
        if holders:
            found = found.copy()
            for worker, depth in holders.items():
                if depth > found.get(worker, 0):
                    found[worker] = min(depth, len(hashes))
        return found

    def resident(self, request: RequestFeatures, worker: WorkerId) -> int | None:
        """The index's claim on ``worker`` cut where more than a KV turnover was sent there
        after it (``PrefixIndex.resident_depth``): the engine's LRU has likely evicted the
        rest, and a TTFT predicted on it is short by the recompute. The store's holders
        (another replica's placements) stand."""
        rid, found, holders, exact = self._claims
        mine = rid == request.request_id and worker not in exact
        depth = found.get(worker, 0) if mine else 0
        if not depth:
            return None
        hashes, index = request.prefix_hashes, self.index
        kept = index.resident_depth(hashes, worker, depth)
        if kept >= depth:
            return None
        kept = max(kept, min(holders.get(worker, 0), len(hashes)))
        return min(index.depth_chars(kept), request.prompt_chars)


def exact_matches(
    found: dict[WorkerId, int],
    resident: Resident,
    depth_within: Callable[[int], int],
    blocks: int,
) -> dict[WorkerId, int]:
    """``found`` (blocks of a chain each worker is claimed to hold) with every claim on a
    worker that publishes KV events replaced by what its engine holds (``resident``):
    none where it holds none, whatever was sent there. ``depth_within`` turns held
    characters into the whole blocks they cover; no claim exceeds ``blocks``."""
    exact = resident.exact
    matches = {w: d for w, d in found.items() if w not in exact} if found else {}
    groups = resident.groups
    if groups is None:  # workers hold a chain to few depths: one conversion a depth
        by_chars: dict[int, list[WorkerId]] = {}
        for worker, chars in resident.chars.items():
            by_chars.setdefault(chars, []).append(worker)
        groups = tuple((chars, tuple(ws)) for chars, ws in by_chars.items())
    for chars, workers in groups:
        depth = depth_within(chars)
        if not depth:
            continue
        depth = depth if depth < blocks else blocks
        if not matches:
            matches = dict.fromkeys(workers, depth)
            continue
        for worker in workers:  # not ``update(dict.fromkeys(...))``: one dict less
            matches[worker] = depth
    return matches


_SETS: tuple[type, ...] = (frozenset, set, type({}.keys()))
"""Sets by type, asked first: ``isinstance`` against the ABC ran Python code each call."""


def _within(exact: Collection[WorkerId], *known: AbstractSet[WorkerId]) -> bool:
    """Whether every worker of ``known`` is in ``exact``."""
    if type(exact) in _SETS or isinstance(exact, AbstractSet):
        return all(k <= exact for k in known)  # type: ignore[operator]
    return all(w in exact for k in known for w in k)


def evicted_tokens(new_tokens: float, fill: float, reuse: float, reserved: float = 0.0) -> float:
    """What ``new_tokens`` evict on a worker whose cache is ``fill`` full costs later
    requests, in prefill tokens (times the worker's prefill seconds a token: seconds): the
    evicted share of them, each worth the chance it would have been hit (``reuse``, a
    measured hit ratio), or certainly where it is ``reserved`` (the share of the cache held
    for sessions coming back, 0-1). ``fill`` may pass 1: content sent there that is more
    than the cache holds is more that returning requests will ask for."""
    if new_tokens <= 0.0 or fill <= 0.0:
        return 0.0
    return new_tokens * fill * (reuse * (1.0 - reserved) + reserved)
