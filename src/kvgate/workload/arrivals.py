"""Arrival processes: when requests (or sessions) start, in virtual seconds.

Every process is an endless iterator of increasing times drawn from a seeded
``random.Random`` handed in by the workload, so a seed fixes the whole stream.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from kvgate.types import Seconds


@dataclass(frozen=True, slots=True)
class ArrivalSpec:
    """How arrivals are spaced.

    ``kind`` is ``poisson`` (exponential gaps at ``rate`` per second) or ``bursty``
    (on/off-modulated Poisson: on periods of mean ``on_s`` at a rate raised so the
    long-run average is still ``rate``, then silent periods of mean ``off_s``).
    """

    kind: str = "poisson"
    rate: float = 10.0
    on_s: Seconds = 5.0
    off_s: Seconds = 15.0

    def __post_init__(self) -> None:
        if self.kind not in ("poisson", "bursty"):
            raise ValueError(f"unknown arrival process {self.kind!r}; use poisson or bursty")
        if self.rate <= 0:
            raise ValueError("arrival rate must be positive")

    def scaled(self, factor: float) -> ArrivalSpec:
        """The same process with ``factor`` times the rate."""
        return ArrivalSpec(self.kind, self.rate * factor, self.on_s, self.off_s)

    def times(self, rng: random.Random, rate: float | None = None) -> Iterator[Seconds]:
        """Arrival instants from 0 on; ``rate`` overrides the spec's rate."""
        if self.kind == "poisson":
            return poisson_times(rng, rate or self.rate)
        return bursty_times(rng, rate or self.rate, self.on_s, self.off_s)


def poisson_times(rng: random.Random, rate: float) -> Iterator[Seconds]:
    """A Poisson process at ``rate`` arrivals per second."""
    now = 0.0
    while True:
        now += rng.expovariate(rate)
        yield now


def bursty_times(
    rng: random.Random, rate: float, on_s: Seconds, off_s: Seconds
) -> Iterator[Seconds]:
    """An on/off-modulated Poisson process whose long-run mean rate is ``rate``."""
    on_rate = rate * (on_s + off_s) / on_s
    now = 0.0
    while True:
        period_end = now + rng.expovariate(1.0 / on_s)
        while True:
            gap = rng.expovariate(on_rate)
            if now + gap > period_end:
                break
            now += gap
            yield now
        # Exponential gaps are memoryless, so dropping the overshoot keeps the
        # on-period rate exact.
        now = period_end + rng.expovariate(1.0 / off_s)


class RatedArrivals:
    """What a config with ``arrival`` and ``rate`` fields shares: its arrival process."""

    __slots__ = ()
    arrival: str
    rate: float

    def arrival_spec(self) -> ArrivalSpec:
        """The arrival process at the configured rate."""
        return ArrivalSpec(self.arrival, self.rate)
