"""Cache claims: what each worker holds of a request's chain, and how far to trust it.

``caches.IndexResidency`` reads every source there is; a claim past what the index judges
resident (old entries, the store's holders) counts at the share of such claims the
workers' ``cached_tokens`` confirm (``ClaimShares``; why: ``docs/dev/default.md``).
"""

from __future__ import annotations

from collections import OrderedDict

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
