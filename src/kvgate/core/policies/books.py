"""The default policy's bookkeeping of conversation lives."""

from __future__ import annotations

import math
from collections import OrderedDict

from kvgate.types import Seconds


class Life:
    """Prefill seconds routed over conversations opened (both halved every ``half_s``)."""

    __slots__ = ("at", "opened", "seconds")

    def __init__(self) -> None:
        self.seconds, self.opened, self.at = 0.0, 0.0, 0.0

    def add(self, now: Seconds, half_s: float, seconds: float, opened: float) -> None:
        age = now - self.at
        if age > 0.0:
            decay = math.exp2(-age / half_s)
            self.seconds *= decay
            self.opened *= decay
            self.at = now
        self.seconds += seconds
        self.opened += opened

    def mean(self) -> float:
        return self.seconds / self.opened if self.opened >= 1e-9 else 0.0


class Conversations:
    """What a headerless conversation routes over its life, measured as it goes: the
    prefill of an opening turn, that of a later turn, and how many turns one has (a turn
    is *continued* when a later one runs through its end, ``ChainEnds.through``, and
    *final* once none has for ``idle_gaps`` mean gaps), each halved every ``half_s``
    (``docs/dev/default.md``)."""

    __slots__ = ("_continued", "_final", "_gap", "_later", "_opening", "_pending", "half_s",
                 "idle_gaps", "max_pending")  # fmt: skip

    def __init__(self, half_s: Seconds, max_pending: int = 65_536, idle_gaps: float = 4.0) -> None:
        self.half_s = half_s
        self.idle_gaps = idle_gaps
        self.max_pending = max_pending
        self._opening = Life()  # prefill seconds an opening turn routes, per opening
        self._later = Life()  # prefill seconds a later turn routes, per later turn
        self._continued = Life()  # turns continued, per turn resolved
        self._gap = Life()  # seconds from a turn to the next, per continuation
        # Turns not yet continued, oldest first: request id -> when routed.
        self._pending: OrderedDict[str, Seconds] = OrderedDict()
        # Turns judged final, oldest first: request id -> when routed.
        self._final: OrderedDict[str, Seconds] = OrderedDict()

    def routed(self, request_id: str, now: Seconds, seconds: float, extends: str | None) -> None:
        """A headerless request was routed with ``seconds`` of prefill: an opening
        (``extends`` None) or the next turn of the request ``extends`` names."""
        half, pending = self.half_s, self._pending
        if extends is None:
            self._opening.add(now, half, seconds, 1.0)
        else:
            self._later.add(now, half, seconds, 1.0)
            at = pending.pop(extends, None)
            late = self._final.pop(extends, None) if at is None else None
            if at is not None or late is not None:  # a late one was judged final: undone
                self._continued.add(now, half, 1.0, 0.0 if at is None else 1.0)
                self._gap.add(now, half, now - (at if at is not None else late or 0.0), 1.0)
        pending.pop(request_id, None)
        pending[request_id] = now
        gap = self._gap.mean()
        idle = now - self.idle_gaps * gap if gap > 0.0 else None
        while pending:
            first = next(iter(pending.values()))
            old = idle is not None and first < idle
            if not old and len(pending) <= self.max_pending:
                break
            rid, at = pending.popitem(last=False)
            if old:  # a final turn (one only forgotten, for room, is no evidence)
                self._continued.add(now, half, 0.0, 1.0)
                final = self._final
                final[rid] = at
                if len(final) > self.max_pending:
                    final.popitem(last=False)

    def turns(self) -> float:
        """Turns a conversation has, on average (1: one-shot traffic, or nothing seen yet)."""
        life = self._continued
        continued = life.seconds
        return 1.0 + continued / (life.opened - continued + 1.0)

    def life_s(self) -> float:
        """Prefill seconds a conversation routes over its life (0: nothing routed yet)."""
        return self._opening.mean() + (self.turns() - 1.0) * self._later.mean()
