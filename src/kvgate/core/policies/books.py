"""The default policy's bookkeeping: each worker's queue estimate, and conversation lives.

Plain mutable records the policy updates on every placement and report; kept apart
from the decision so ``core.policies.default`` reads as the cost model it is.
"""

from __future__ import annotations

import math

from kvgate.types import Seconds


class Book:
    """What the policy keeps per worker: its prefill queue estimate, cache fill, recent count.

    One object a worker, so a decision costs one dictionary probe per worker.
    """

    __slots__ = ("busy_until", "fill", "owed_s", "recent", "recent_at")

    def __init__(self, now: Seconds) -> None:
        self.busy_until = now
        """When the prefill queued there is done, at the configured rate (virtual time)."""
        self.owed_s = 0.0
        """Prefill seconds of the requests routed there and not yet reported back."""
        self.fill = 0.0
        """How full its share of the prefix index is (``PrefixIndex.fill``)."""
        self.recent = 0.0
        self.recent_at = now


class Life:
    """What a conversation routes over its life, on average: prefill seconds over openings.

    Both counts are halved every ``half_s`` (together, so only their ratio matters).
    """

    __slots__ = ("at", "opened", "seconds")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.opened = 0.0
        self.at: Seconds = 0.0

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
