"""Sliding outcome windows: counts, quantile accuracy, expiry, bounds, merging."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from kvgate.core.window import (
    HistogramScale,
    OutcomeWindow,
    QualityStats,
    VersionWindows,
    WindowStats,
)


def test_empty_window_has_no_values() -> None:
    stats = OutcomeWindow().stats(100.0)
    assert stats == WindowStats(start=-200.0, end=100.0)
    assert stats.error_rate is None
    assert OutcomeWindow().quality(100.0) == QualityStats(samples=0, mean=None)


def test_counts_and_error_rate() -> None:
    window = OutcomeWindow(window_s=60, bucket_s=5)
    for i in range(200):
        window.record(i * 0.1, error=i % 20 == 0, latency_s=0.5, ttft_s=0.1)
    stats = window.stats(20.0)
    assert (stats.requests, stats.errors) == (200, 10)
    assert stats.error_rate == pytest.approx(0.05)
    assert (stats.latency_samples, stats.ttft_samples) == (200, 200)


def test_missing_latency_and_ttft_are_not_samples() -> None:
    window = OutcomeWindow()
    window.record(1.0, error=True)
    window.record(1.0, latency_s=float("nan"), ttft_s=None)
    stats = window.stats(2.0)
    assert (stats.requests, stats.errors, stats.latency_samples, stats.ttft_samples) == (
        2,
        1,
        0,
        0,
    )
    assert stats.latency_p99 is None


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_quantiles_are_within_relative_accuracy(seed: int, q: float) -> None:
    rng = random.Random(seed)
    samples = [rng.lognormvariate(-1.0, 0.8) for _ in range(3_000)]
    window = OutcomeWindow(window_s=600, bucket_s=10)
    for i, value in enumerate(samples):
        window.record(i * 0.1, latency_s=value, ttft_s=value / 10)
    stats = window.stats(300.0)
    exact = float(np.quantile(samples, q, method="lower"))
    field = {0.5: "p50", 0.95: "p95", 0.99: "p99"}[q]
    latency = getattr(stats, f"latency_{field}")
    ttft = getattr(stats, f"ttft_{field}")
    assert latency == pytest.approx(exact, rel=0.0101)
    assert ttft == pytest.approx(exact / 10, rel=0.0101)


def test_old_outcomes_leave_the_window() -> None:
    window = OutcomeWindow(window_s=30, bucket_s=5)
    window.record(0.0, error=True, latency_s=5.0)
    window.record(40.0, latency_s=1.0)
    stats = window.stats(41.0)
    assert (stats.requests, stats.errors) == (1, 0)
    assert stats.latency_p99 == pytest.approx(1.0, rel=0.01)


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        # Spans answer to the bucket: the bucket holding the span's start counts.
        (None, 31),  # the 30 s window [0.5, 30.5] overlaps buckets 0..30
        (20.0, 11),  # cut at the step start: buckets 20..30
        (-100.0, 31),  # a `since` before the window does not widen it
        (30.0, 1),
    ],
)
def test_since_cuts_the_span(since: float | None, expected: int) -> None:
    window = OutcomeWindow(window_s=30, bucket_s=1)
    for t in range(31):
        window.record(float(t), latency_s=0.1)
    assert window.stats(30.5, since=since).requests == expected


def test_memory_is_bounded_over_a_long_run() -> None:
    window = OutcomeWindow(window_s=60, bucket_s=5)
    rng = random.Random(0)
    for i in range(20_000):
        window.record(i * 0.5, latency_s=rng.expovariate(1.0), ttft_s=rng.random())
    assert len(window) <= window.max_buckets == 13
    scale = window.scale
    max_bins = scale.index(scale.max_value) - scale.index(scale.min_value) + 1
    assert max_bins < 1_200
    stats = window.stats(10_000.0)
    assert stats.requests == 120


def test_late_report_for_an_expired_bucket_is_dropped() -> None:
    window = OutcomeWindow(window_s=30, bucket_s=5)
    window.record(100.0, latency_s=0.1)
    window.record(10.0, latency_s=9.0)  # far behind the window's head
    window.record_score(10.0, 0.0)
    window.record(95.0, latency_s=0.2)  # late, but still inside the window
    assert window.stats(100.0).requests == 2
    assert window.quality(100.0).samples == 0


def test_out_of_range_values_are_clamped() -> None:
    scale = HistogramScale(min_value=1e-3, max_value=10.0)
    low, high = OutcomeWindow(scale=scale), OutcomeWindow(scale=scale)
    low.record(0.0, latency_s=0.0)
    high.record(0.0, latency_s=1e9)
    assert low.stats(1.0).latency_p99 == pytest.approx(1e-3, rel=0.01)
    assert high.stats(1.0).latency_p99 == pytest.approx(10.0, rel=0.01)


def test_quality_scores_average_over_the_span() -> None:
    window = OutcomeWindow(window_s=60, bucket_s=5)
    for i, score in enumerate([1.0, 0.5, 0.0, 0.5]):
        window.record_score(float(i), score)
    window.record_score(5.0, float("inf"))  # ignored
    assert window.quality(10.0) == QualityStats(samples=4, mean=0.5)
    assert window.quality(10.0, since=5.0) == QualityStats()


def test_merge_equals_recording_into_one_window() -> None:
    rng = random.Random(11)
    events = [(rng.uniform(0, 120), rng.random() < 0.1, rng.expovariate(2.0)) for _ in range(2_000)]
    whole = OutcomeWindow(window_s=60, bucket_s=5)
    parts = [OutcomeWindow(window_s=60, bucket_s=5) for _ in range(3)]
    for i, (t, error, latency) in enumerate(sorted(events)):
        whole.record(t, error=error, latency_s=latency)
        parts[i % 3].record(t, error=error, latency_s=latency)
    merged = OutcomeWindow(window_s=60, bucket_s=5)
    for part in parts:
        merged.merge(part)
    assert merged.stats(120.0) == whole.stats(120.0)


def test_merge_refuses_different_buckets() -> None:
    with pytest.raises(ValueError, match="same bucket_s"):
        OutcomeWindow(bucket_s=5).merge(OutcomeWindow(bucket_s=10))


def test_round_trip_through_dict() -> None:
    window = OutcomeWindow(window_s=60, bucket_s=5)
    for i in range(300):
        window.record(i * 0.3, error=i % 7 == 0, latency_s=0.01 * (i % 13 + 1), ttft_s=0.002 * i)
        window.record_score(i * 0.3, (i % 5) / 4)
    copy = OutcomeWindow.from_dict(window.to_dict())
    assert copy.stats(90.0) == window.stats(90.0)
    assert copy.quality(90.0) == window.quality(90.0)


@pytest.mark.parametrize(
    ("window_s", "bucket_s", "message"),
    [
        (0.0, 5.0, "must be > 0"),
        (60.0, -1.0, "must be > 0"),
        (5.0, 10.0, "at least one bucket_s"),
    ],
)
def test_invalid_window_shapes(window_s: float, bucket_s: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OutcomeWindow(window_s=window_s, bucket_s=bucket_s)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"relative_accuracy": 0.0}, "relative_accuracy"),
        ({"min_value": 1.0, "max_value": 1.0}, "min_value < max_value"),
    ],
)
def test_invalid_scales(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HistogramScale(**kwargs)


def test_version_windows_keep_versions_apart() -> None:
    windows = VersionWindows(window_s=60, bucket_s=5)
    windows.record("v1", 1.0, latency_s=0.1)
    windows.record("v2", 1.0, error=True, latency_s=0.3)
    windows.record_score("v2", 1.0, 0.25)
    assert windows.stats("v1", 2.0).errors == 0
    assert windows.stats("v2", 2.0).error_rate == 1.0
    assert windows.quality("v2", 2.0).mean == 0.25
    assert set(windows.versions()) == {"v1", "v2"}
    windows.forget("v2")
    assert windows.stats("v2", 2.0).requests == 0
    assert math.isclose(windows.stats("v1", 2.0).latency_p50 or 0.0, 0.1, rel_tol=0.01)
