"""Paired comparisons over seeds: a mean with its 95% interval, and what it says of a bar.

Two routers run on the same seeds see the same requests, so their figures are
compared seed by seed: a **ratio** (TTFT) as the geometric mean of the per-seed
ratios with Student's t interval on their logarithms, a **difference** (hit rate,
in points) as the mean per-seed difference with its t interval. A bar is then
**met** where the whole interval is on its good side, a **loss** only where the
whole interval is on its bad side (the data exclude parity with the bar), and
**open** where the interval holds the bar: more seeds, or no verdict. A percentile
that is unbounded (+inf: it fell on requests a router never answered) is compared as
such, never averaged (``paired_ratio``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

T_975: tuple[float, ...] = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""Student's t at 97.5% for 1..30 degrees of freedom (a two-sided 95% interval)."""

MET = "met"
LOSS = "LOSS"
OPEN = "open"


def t975(df: int) -> float:
    """Student's t quantile at 97.5% for ``df`` degrees of freedom (past 30, Cornish-Fisher's
    first correction to the normal's 1.96, within 0.001 of the exact value)."""
    if df < 1:
        raise ValueError("an interval needs at least two observations")
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)


@dataclass(frozen=True)
class Estimate:
    """A paired estimate over ``n`` seeds: its value and 95% interval (None below two seeds)."""

    value: float
    low: float | None
    high: float | None
    n: int

    def to_json(self) -> dict[str, float | int | None]:
        """JSON-ready, rounded."""
        return {
            "value": round(self.value, 6),
            "low": None if self.low is None else round(self.low, 6),
            "high": None if self.high is None else round(self.high, 6),
            "n": self.n,
        }


def mean_interval(values: Sequence[float]) -> Estimate:
    """The mean of ``values`` and its t interval."""
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    n = len(values)
    if n < 2:
        return Estimate(mean, None, None, n)
    half = t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n)


def paired_ratio(own: Sequence[float], other: Sequence[float]) -> Estimate:
    """``own / other`` over paired seeds: the geometric mean ratio and its interval (t on logs).

    Pairs where either value is not positive are left out (a ratio has no log there).
    An unbounded value (+inf: a percentile that fell on requests never answered) is not
    averaged, it decides: a seed where only ``own``'s is unbounded is a ratio of +inf, one
    where only ``other``'s is, 0, and one where both are says nothing (left out). Any +inf
    ratio and no 0 make the estimate +inf, interval and all (past every bar: ``own`` refused
    what ``other`` answered); any 0 and no +inf make it 0; both, the interval [0, +inf]
    holds every bar (each refused where the other answered; the value is the side with
    more such seeds, 1 where even).
    """
    pairs = [(a, b) for a, b in zip(own, other, strict=True) if a > 0 and b > 0]
    pairs = [(a, b) for a, b in pairs if not (math.isinf(a) and math.isinf(b))]
    if not pairs:
        raise ValueError("no pair with both values positive and one bounded")
    worse = sum(1 for a, _ in pairs if math.isinf(a))
    better = sum(1 for _, b in pairs if math.isinf(b))
    if worse or better:
        value = math.inf if worse > better else 0.0 if better > worse else 1.0
        return Estimate(
            value, math.inf if not better else 0.0, 0.0 if not worse else math.inf, len(pairs)
        )
    logs = [math.log(a / b) for a, b in pairs]
    e = mean_interval(logs)
    return Estimate(
        math.exp(e.value),
        None if e.low is None else math.exp(e.low),
        None if e.high is None else math.exp(e.high),
        e.n,
    )


def paired_points(own: Sequence[float], other: Sequence[float]) -> Estimate:
    """``own - other`` in points (fractions times 100) over paired seeds, with its interval."""
    return mean_interval([100.0 * (a - b) for a, b in zip(own, other, strict=True)])


def at_most(e: Estimate, bound: float) -> str:
    """The verdict on "at most ``bound``" (a ratio bar)."""
    if e.low is None or e.high is None:
        return OPEN
    if e.high <= bound:
        return MET
    if e.low > bound:
        return LOSS
    return OPEN


def at_least(e: Estimate, bound: float) -> str:
    """The verdict on "at least ``bound``" (a difference bar, e.g. -1 point)."""
    if e.low is None or e.high is None:
        return OPEN
    if e.low >= bound:
        return MET
    if e.high < bound:
        return LOSS
    return OPEN


def within(e: Estimate, low: float, high: float) -> str:
    """The verdict on "between ``low`` and ``high``" (a share within a band)."""
    if e.low is None or e.high is None:
        return OPEN
    if low <= e.low and e.high <= high:
        return MET
    if e.high < low or e.low > high:
        return LOSS
    return OPEN
