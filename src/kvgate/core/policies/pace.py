"""``Pace``: requests a second lately, as ``ttft`` counts the requests a placement delays.

The mean gap between the last ``span`` arrivals, counted in arrivals rather than seconds
so a burst shows at once, and a quiet spell lowers it as it lasts (the gap since the last
arrival counts).
"""

from __future__ import annotations

from kvgate.types import Seconds


class Pace:
    """Requests a second lately (see the module docs)."""

    __slots__ = ("at", "gap", "span")

    def __init__(self, span: int = 16) -> None:
        self.span = span
        self.gap = -1.0  # no gap seen yet
        self.at: Seconds | None = None

    def note(self, now: Seconds) -> None:
        """One more request arrived at ``now``."""
        at = self.at
        if at is not None:
            gap = max(0.0, now - at)
            self.gap = gap if self.gap < 0.0 else self.gap + (gap - self.gap) / self.span
        self.at = now

    def rate(self, now: Seconds) -> float:
        """Arrivals a second (0 before two arrivals)."""
        at = self.at
        if at is None or self.gap < 0.0:
            return 0.0
        return 1.0 / max(self.gap, now - at, 1e-9)
