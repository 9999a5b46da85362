"""Canary analysis gates: bounds on the canary's error rate, latency and quality.

Each gate reads window stats (``core.window``) and gives a ``GateResult``:
pass, fail, or inconclusive when it has too few samples ("no values found"
must never pass, as Flagger learned). ``core.rollout`` drives them.
"""

from __future__ import annotations

from enum import StrEnum
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
    bound) is inconclusive.
    """

    max_error_rate: float | None = Field(default=0.01, ge=0, le=1)
    latency_p95: Bound | None = None
    latency_p99: Bound | None = Bound(max_factor=1.5)
    ttft_p95: Bound | None = None
    ttft_p99: Bound | None = Bound(max_factor=1.5)
    quality: QualityGate | None = None
    min_samples: int = Field(default=50, ge=1)


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
        results.append(
            _ceiling(
                "error_rate",
                canary.error_rate,
                gates.max_error_rate,
                canary.requests,
                canary.requests >= need,
            )
        )
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


def measured(stats: WindowStats, need: int) -> bool:
    """True when ``stats`` has enough latency or TTFT samples to compare against."""
    return max(stats.latency_samples, stats.ttft_samples) >= need


def fmt_num(value: float | None) -> str:
    """A gate value for messages: four significant digits, or ``none``."""
    return "none" if value is None else f"{value:.4g}"
