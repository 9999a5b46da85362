"""How far to trust cache claims that the prefix index cannot vouch for, learned from usage.

The default policy's expected TTFT counts a worker's cache twice over: what the
index judges still resident (``PrefixIndex.resident_depth``) and what is only
*claimed*, by index entries older than the worker's KV turnover or by the shared
store's holders (another replica's placements, or this one's long forgotten). On
one gateway a claim past the index is mostly stale, and counting it as cached
hides multi-second recomputes from the queue estimate; behind several replicas
most of it is another replica's fresh placement. Neither can be known up front,
so ``ClaimTrust`` measures it: each placement remembers the characters resident
and claimed on its worker, and the worker's reported ``cached_tokens`` say how
much of the claimed part was there. The trust is the running share confirmed
(an exponential average, starting at none), and the TTFT terms count
``resident + trust × (claimed - resident)``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kvgate.core.policy import Resident
from kvgate.types import WorkerId


class ClaimTrust:
    """The share of unverified cache claims that workers' usage reports confirm."""

    __slots__ = ("_pending", "max_pending", "rate", "trust")

    def __init__(self, rate: float = 0.1, max_pending: int = 65_536, trust: float = 0.0) -> None:
        self.trust = trust
        """Expected share of a claim past the resident cache that hits (1: as claimed)."""
        self.rate = rate
        self.max_pending = max_pending
        # Request id -> (worker, resident chars, claimed chars) of placements with a gap.
        self._pending: OrderedDict[str, tuple[WorkerId, int, int]] = OrderedDict()

    def expected(self, resident_chars: int, claimed_chars: int) -> float:
        """Characters expected cached, of ``claimed_chars`` of which ``resident_chars`` vouched."""
        if claimed_chars <= resident_chars:
            return claimed_chars
        return resident_chars + self.trust * (claimed_chars - resident_chars)

    def note_routed(
        self, request_id: str, worker: WorkerId, resident_chars: int, claimed_chars: int
    ) -> None:
        """Remember a placement whose claim outran the resident cache, to judge it later."""
        if claimed_chars <= resident_chars:
            self._pending.pop(request_id, None)
            return
        pending = self._pending
        pending.pop(request_id, None)
        pending[request_id] = (worker, resident_chars, claimed_chars)
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
        """Move the trust toward the share of the claim the worker's report confirms."""
        entry = self._pending.pop(request_id, None)
        if entry is None or entry[0] != worker or prompt_tokens <= 0:
            return
        _, resident, claimed = entry
        cached = cached_tokens * prompt_chars / prompt_tokens
        confirmed = min(max(0.0, cached - resident), claimed - resident) / (claimed - resident)
        self.trust += self.rate * (confirmed - self.trust)


LRU_TURNOVER = 1.0
"""KV capacities sent after a block past which an engine's LRU has likely evicted it."""


class ClaimShares:
    """A claim judged in three parts: *young* (sent within one KV turnover, counted in
    full), a *band* up to the index's resident cut (counted at a learned share, trusted
    at first), and the rest (index entries past the cut, the store's holders: counted
    at a learned share, trusted at none). Each share is a ``ClaimTrust``."""

    __slots__ = ("band", "past")

    def __init__(self, max_pending: int = 65_536) -> None:
        self.band = ClaimTrust(max_pending=max_pending, trust=1.0)
        self.past = ClaimTrust(max_pending=max_pending)

    def expected(self, young_chars: int, resident_chars: int, claimed_chars: int) -> float:
        """Characters expected cached of a claim cut at ``young`` and ``resident`` chars."""
        band = self.band.expected(young_chars, resident_chars)
        return band + self.past.expected(resident_chars, claimed_chars) - resident_chars

    def likely(self, young_chars: int, resident_chars: int, claimed_chars: int) -> int:
        """Characters most likely cached: each part in full where it more likely hits than
        not. The TTFT predicted at a send (``core.speed``) takes this, not ``expected``: a
        claim that hits four times in five is all cached four times in five, and a TTFT
        predicted at its mean is off every time."""
        cached = max(young_chars, 0)
        if self.band.trust >= 0.5:
            cached = max(cached, resident_chars)
            if self.past.trust >= 0.5:
                cached = max(cached, claimed_chars)
        return cached

    def note_routed(
        self, request_id: str, worker: WorkerId, young: int, resident: int, claimed: int
    ) -> None:
        """Remember a placement's claim (in chars), to judge both parts by its usage."""
        self.band.note_routed(request_id, worker, young, resident)
        self.past.note_routed(request_id, worker, resident, claimed)

    def note_usage(
        self,
        request_id: str,
        worker: WorkerId,
        prompt_chars: int,
        prompt_tokens: int,
        cached_tokens: int,
    ) -> None:
        """Move both shares toward what the worker's report confirms."""
        self.band.note_usage(request_id, worker, prompt_chars, prompt_tokens, cached_tokens)
        self.past.note_usage(request_id, worker, prompt_chars, prompt_tokens, cached_tokens)


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
