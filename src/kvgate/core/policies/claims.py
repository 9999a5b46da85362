"""Cache claims: what each worker holds of a request's chain, and how far to trust it.

``Residency`` reads every source there is; a claim past what the index judges resident
(old entries, the store's holders) counts at the share of such claims the workers'
``cached_tokens`` confirm (``ClaimShares``; why: ``docs/dev/default.md``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection
from collections.abc import Set as AbstractSet

from kvgate.core.features import RequestFeatures
from kvgate.core.policies.prefix_affinity import PrefixLearning
from kvgate.core.policies.running import RunningBlocks
from kvgate.core.policy import Resident, RouteContext
from kvgate.types import WorkerId

LRU_TURNOVER = 1.0
"""KV capacities sent after a block past which an engine's LRU has likely evicted it."""


class ClaimShares:
    """A claim judged in three parts: *young* (sent within one KV turnover, counted in
    full), a *band* up to the index's resident cut (counted at the share ``band`` of such
    bands that hit, trusted at first), and the rest (index entries past the cut, the
    store's holders: counted at the share ``past`` that hit, trusted at none). Each share
    moves ``rate`` of the way to what a worker's usage confirms of a placement's claim."""

    __slots__ = ("_pending", "band", "max_pending", "past", "rate")

    def __init__(self, max_pending: int = 65_536, rate: float = 0.1) -> None:
        self.band, self.past, self.rate, self.max_pending = 1.0, 0.0, rate, max_pending
        # Request id -> (worker, young, resident, claimed chars) of placements with a gap.
        self._pending: OrderedDict[str, tuple[WorkerId, int, int, int]] = OrderedDict()

    def expected(self, young_chars: int, resident_chars: int, claimed_chars: int) -> float:
        """Characters expected cached of a claim cut at ``young`` and ``resident`` chars."""
        band = _part(young_chars, resident_chars, self.band)
        return band + _part(resident_chars, claimed_chars, self.past) - resident_chars

    def likely(self, young_chars: int, resident_chars: int, claimed_chars: int) -> int:
        """Characters most likely cached: each part in full where it more likely hits than
        not. The TTFT predicted at a send (``core.speed``) takes this, not ``expected``: a
        claim that hits four times in five is all cached four times in five."""
        cached = max(young_chars, 0)
        if self.band >= 0.5:
            cached = max(cached, resident_chars)
            if self.past >= 0.5:
                cached = max(cached, claimed_chars)
        return cached

    def note_routed(
        self, request_id: str, worker: WorkerId, young: int, resident: int, claimed: int
    ) -> None:
        """Remember a placement's claim (in chars), to judge its parts by its usage."""
        pending = self._pending
        pending.pop(request_id, None)
        if resident > young or claimed > resident:
            pending[request_id] = (worker, young, resident, claimed)
            if len(pending) > self.max_pending:
                pending.popitem(last=False)

    def note_usage(
        self,
        request_id: str,
        worker: WorkerId,
        prompt_chars: int,
        prompt_tokens: int,
        cached_tokens: int,
    ) -> None:
        """Move each share toward the part of its claim the worker's report confirms."""
        entry = self._pending.pop(request_id, None)
        if entry is None or entry[0] != worker or prompt_tokens <= 0:
            return
        _, young, resident, claimed = entry
        cached = cached_tokens * prompt_chars / prompt_tokens
        if resident > young:
            self.band += self.rate * (_confirmed(cached, young, resident) - self.band)
        if claimed > resident:
            self.past += self.rate * (_confirmed(cached, resident, claimed) - self.past)


def _part(vouched: int, claimed: int, share: float) -> float:
    """Characters expected cached of ``claimed``, ``vouched`` of them in full."""
    return claimed if claimed <= vouched else vouched + share * (claimed - vouched)


def _confirmed(cached: float, vouched: int, claimed: int) -> float:
    """The share of a claim's part past ``vouched`` that ``cached`` characters confirm."""
    return min(max(0.0, cached - vouched), claimed - vouched) / (claimed - vouched)


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
    matches = {w: d for w, d in found.items() if w not in exact}
    groups = resident.groups
    if groups is None:  # workers hold a chain to few depths: one conversion a depth
        by_chars: dict[int, list[WorkerId]] = {}
        for worker, chars in resident.chars.items():
            by_chars.setdefault(chars, []).append(worker)
        groups = tuple((chars, tuple(ws)) for chars, ws in by_chars.items())
    for chars, workers in groups:
        depth = depth_within(chars)
        if depth:
            matches.update(dict.fromkeys(workers, depth if depth < blocks else blocks))
    return matches


class Residency(PrefixLearning):
    """``matches``: blocks of a request's chain per worker, best source first: the engine's
    word where it publishes KV events (with the chains of requests in flight there, which
    it has not stored yet), this replica's index, the store's holders. A base of
    ``DefaultPolicy`` (through ``Warming``)."""

    _running: RunningBlocks  # the chains of the requests in flight, per worker
    _told: tuple[str, Collection[WorkerId]] = ("", ())
    """The last request looked up and the workers whose KV events told its claims."""

    def matches(self, request: RequestFeatures, ctx: RouteContext) -> dict[WorkerId, int]:
        """Blocks of the request's chain each worker holds: the index's or the store's,
        deeper; for a worker that publishes KV events, what its engine says."""
        hashes = request.prefix_hashes
        resident = ctx.resident
        found: dict[WorkerId, int] = {}
        # Where every worker the index or the store could name publishes events, their
        # claims would all be replaced by the engines' word: not looked up (~11 µs).
        if resident is None or not _within(
            resident.exact, self.index.known_workers(), ctx.holders.keys()
        ):
            found = self.index.match(hashes) if hashes else {}
            for worker, depth in ctx.holders.items():
                if depth > found.get(worker, 0):
                    found[worker] = min(depth, len(hashes))
        if resident is None:
            return found
        self._told = (request.request_id, resident.exact)
        found = exact_matches(found, resident, self.index.depth_within, len(hashes))
        for worker, depth in self._running.shared_depths(hashes, resident.exact):
            if depth > found.get(worker, 0):
                found[worker] = depth
        return found

    def told(self, request: RequestFeatures, worker: WorkerId) -> bool:
        """Whether ``worker``'s claim on ``request`` (``matches``) is its engine's word."""
        rid, exact = self._told
        return rid == request.request_id and worker in exact


def _within(exact: Collection[WorkerId], *known: AbstractSet[WorkerId]) -> bool:
    """Whether every worker of ``known`` is in ``exact``."""
    if isinstance(exact, AbstractSet):
        return all(k <= exact for k in known)
    return all(w in exact for k in known for w in k)
