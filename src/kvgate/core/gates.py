"""Canary analysis gates: bounds on the canary's error rate, latency and quality.

Each gate reads window stats (``core.window``) and gives a ``GateResult``:
pass, fail, or inconclusive when it has too few samples ("no values found"
must never pass, as Flagger learned). ``core.rollout`` drives them.
"""

from __future__ import annotations

import math
from enum import StrEnum
from statistics import NormalDist
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvgate.core.window import QualityStats, WindowStats


class StrictModel(BaseModel):
    """Frozen pydantic model that refuses unknown keys (spec errors name the field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Bound(StrictModel):
    """An upper bound on a canary latency quantile, in seconds and/or × the baseline's.

    Example: ``{"max_s": 2.0, "max_factor": 1.5}``: at most 2 s and at most
    1.5 × the baseline's value over the same span (both must hold).
    """

    max_s: float | None = Field(default=None, gt=0)
    max_factor: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_bound(self) -> Self:
        if self.max_s is None and self.max_factor is None:
            raise ValueError("a bound needs max_s and/or max_factor")
        return self


class QualityGate(StrictModel):
    """The canary's mean evaluator score must be at least ``min_mean``."""

    min_mean: float
    min_samples: int = Field(default=20, ge=1)


class Gates(StrictModel):
    """What the canary must satisfy; ``None`` switches a gate off.

    ``min_samples``: a gate with fewer samples (requests for the error rate,
    latency or TTFT samples for the quantiles, on both sides for a factor
    bound) is inconclusive, except that the error gate fails early when the
    errors already prove its bound broken: the Wilson score lower bound of the
    error rate at ``error_confidence`` (one-sided) is above ``max_error_rate``,
    with at least ``EARLY_FAIL_MIN_ERRORS`` errors. A canary failing half its
    requests is rolled back after about six of them, not after ``min_samples``;
    the gate is checked at every evaluation, so the high confidence and the
    error floor keep a canary within its bound from being rolled back by an
    early unlucky streak (about 0.5% of the time at half the bound, over 500
    requests, in ``tests/core/test_gates_sequential.py``). Passing still needs
    ``min_samples`` and an observed rate within the bound: proving a 1% bound
    holds would take about 300 error-free requests.
    """

    max_error_rate: float | None = Field(default=0.01, ge=0, le=1)
    latency_p95: Bound | None = None
    latency_p99: Bound | None = Bound(max_factor=1.5)
    ttft_p95: Bound | None = None
    ttft_p99: Bound | None = Bound(max_factor=1.5)
    quality: QualityGate | None = None
    min_samples: int = Field(default=50, ge=1)
    error_confidence: float = Field(default=0.999, gt=0.5, lt=1)
    """The one-sided confidence at which the errors seen prove ``max_error_rate`` broken:
    the error gate fails as soon as they do, with however few samples."""


EARLY_FAIL_MIN_ERRORS = 3
"""Errors the error gate needs before failing early (below ``min_samples``)."""


class Verdict(StrEnum):
    """A gate's verdict on one evaluation."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


class GateResult(StrictModel):
    """One gate on one evaluation: what was seen, against what bound, and the verdict.

    For ``*_vs_baseline`` gates ``observed`` and ``bound`` are ratios to the
    baseline; for ``quality`` the bound is a floor, for the others a ceiling.
    """

    name: str
    observed: float | None
    bound: float
    verdict: Verdict
    samples: int = 0


_QUANTILE_GATES: tuple[tuple[str, str, str], ...] = (
    ("latency_p95", "latency_p95", "latency_samples"),
    ("latency_p99", "latency_p99", "latency_samples"),
    ("ttft_p95", "ttft_p95", "ttft_samples"),
    ("ttft_p99", "ttft_p99", "ttft_samples"),
)


def _ceiling(
    name: str, observed: float | None, bound: float, samples: int, enough: bool
) -> GateResult:
    if observed is None or not enough:
        verdict = Verdict.INCONCLUSIVE
    else:
        verdict = Verdict.PASS if observed <= bound else Verdict.FAIL
    return GateResult(name=name, observed=observed, bound=bound, verdict=verdict, samples=samples)


def evaluate_gates(
    gates: Gates,
    canary: WindowStats,
    baseline: WindowStats | None,
    quality: QualityStats | None,
) -> tuple[GateResult, ...]:
    """Every configured gate's verdict on the canary (and baseline) stats."""
    need = gates.min_samples
    results: list[GateResult] = []
    if gates.max_error_rate is not None:
        result = _ceiling(
            "error_rate",
            canary.error_rate,
            gates.max_error_rate,
            canary.requests,
            canary.requests >= need,
        )
        if result.verdict is Verdict.INCONCLUSIVE and canary.errors >= EARLY_FAIL_MIN_ERRORS:
            low = wilson_lower(canary.errors, canary.requests, gates.error_confidence)
            if low > gates.max_error_rate:
                result = result.model_copy(update={"verdict": Verdict.FAIL})
        results.append(result)
    for name, value_field, count_field in _QUANTILE_GATES:
        bound: Bound | None = getattr(gates, name)
        if bound is None:
            continue
        value: float | None = getattr(canary, value_field)
        count: int = getattr(canary, count_field)
        if bound.max_s is not None:
            results.append(_ceiling(name, value, bound.max_s, count, count >= need))
        if bound.max_factor is not None:
            base: float | None = getattr(baseline, value_field) if baseline else None
            base_count: int = getattr(baseline, count_field) if baseline else 0
            ratio = value / base if value is not None and base else None
            enough = count >= need and base_count >= need
            results.append(_ceiling(f"{name}_vs_baseline", ratio, bound.max_factor, count, enough))
    if gates.quality is not None:
        q = quality or QualityStats()
        floor = gates.quality.min_mean
        if q.mean is None or q.samples < gates.quality.min_samples:
            verdict = Verdict.INCONCLUSIVE
        else:
            verdict = Verdict.PASS if q.mean >= floor else Verdict.FAIL
        results.append(
            GateResult(
                name="quality", observed=q.mean, bound=floor, verdict=verdict, samples=q.samples
            )
        )
    return tuple(results)


def wilson_lower(successes: int, trials: int, confidence: float) -> float:
    """The one-sided Wilson score lower confidence bound of a proportion.

    Unlike the normal approximation it stays sensible for few trials and for
    proportions near 0 or 1 (3 errors in 3 requests: about 0.53 at 95%).
    """
    if trials <= 0:
        return 0.0
    z = NormalDist().inv_cdf(confidence)
    p = successes / trials
    z2n = z * z / trials
    centre = p + z2n / 2
    spread = z * math.sqrt(p * (1 - p) / trials + z2n / (4 * trials))
    return max(0.0, (centre - spread) / (1 + z2n))


def measured(stats: WindowStats, need: int) -> bool:
    """True when ``stats`` has enough latency or TTFT samples to compare against."""
    return max(stats.latency_samples, stats.ttft_samples) >= need


def fmt_num(value: float | None) -> str:
    """A gate value for messages: four significant digits, or ``none``."""
    return "none" if value is None else f"{value:.4g}"
