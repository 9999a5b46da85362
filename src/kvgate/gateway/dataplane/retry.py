"""The retry budget (Envoy's): retries in flight stay under a share of requests in flight.

A failing worker then cannot turn every request into two or three, which would
pile load on the healthy ones exactly when the fleet is weakest.
"""

from __future__ import annotations

import random


class RetryBudget:
    """Counts requests and retries in flight; ``allow`` grants a retry within the budget."""

    def __init__(self, ratio: float, minimum: int, backoff_base: float, backoff_max: float) -> None:
        self.ratio = ratio
        self.minimum = minimum
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.requests = 0
        self.retries = 0

    def limit(self) -> int:
        """How many retries may be in flight now."""
        return max(self.minimum, int(self.ratio * self.requests))

    def allow(self) -> bool:
        """Take one retry from the budget if there is room; the caller ``give_back``s it."""
        if self.retries >= self.limit():
            return False
        self.retries += 1
        return True

    def give_back(self, retries: int) -> None:
        """A request that had retried ``retries`` times has finished."""
        self.retries -= retries

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Full-jitter exponential backoff before retry number ``attempt`` (1-based)."""
        cap = min(self.backoff_max, self.backoff_base * (2 ** (attempt - 1)))
        return rng.uniform(0.0, cap)
