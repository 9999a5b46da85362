"""Sliding time windows of request outcomes, per model version, in bounded memory.

Time is cut into buckets of ``bucket_s`` seconds, aligned on multiples of
``bucket_s`` (so windows of different gateway replicas line up and merge). Each
bucket holds counts and two sparse log-scale histograms (latency, TTFT) with a
fixed relative accuracy, as DDSketch does: quantiles are within
``relative_accuracy`` of the true value, deterministically, whatever the
traffic. A window keeps at most ``window_s / bucket_s + 1`` buckets, and each
histogram at most ``log(max_value / min_value) / log(gamma)`` bins.

A query covers every bucket that overlaps ``[start, now]``, so it may include up
to one bucket of data from before ``start``: a window answers to the bucket.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvgate.types import Seconds


@dataclass(frozen=True, slots=True)
class HistogramScale:
    """The log-scale bins shared by every histogram of a window.

    Values at or below ``min_value`` share the lowest bin and values above
    ``max_value`` the highest, which bounds the number of bins.
    """

    relative_accuracy: float = 0.01
    min_value: float = 1e-4
    max_value: float = 1e5
    _log_gamma: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.relative_accuracy < 1:
            raise ValueError("relative_accuracy must be in (0, 1)")
        if not 0 < self.min_value < self.max_value:
            raise ValueError("need 0 < min_value < max_value")
        gamma = (1 + self.relative_accuracy) / (1 - self.relative_accuracy)
        object.__setattr__(self, "_log_gamma", math.log(gamma))

    def index(self, value: float) -> int:
        """The bin holding ``value``."""
        clamped = min(max(value, self.min_value), self.max_value)
        return math.ceil(math.log(clamped) / self._log_gamma)

    def value(self, index: int) -> float:
        """The representative value of bin ``index`` (within the relative accuracy)."""
        gamma = math.exp(self._log_gamma)
        return 2 * math.exp(index * self._log_gamma) / (gamma + 1)


def _quantile(scale: HistogramScale, bins: Mapping[int, int], count: int, q: float) -> float | None:
    """The ``q`` quantile of a histogram, or ``None`` when it is empty."""
    if count <= 0:
        return None
    # Lower rank (as DDSketch): the smallest value with at least q*(n-1)+1 values <= it.
    rank = q * (count - 1)
    seen = 0
    for index in sorted(bins):
        seen += bins[index]
        if seen > rank:
            return scale.value(index)
    return scale.value(max(bins))


@dataclass(slots=True)
class _Bucket:
    """Everything recorded during one ``bucket_s`` slice of time."""

    requests: int = 0
    errors: int = 0
    latency: dict[int, int] = field(default_factory=dict)
    ttft: dict[int, int] = field(default_factory=dict)
    score_count: int = 0
    score_sum: float = 0.0

    def add(self, other: _Bucket) -> None:
        self.requests += other.requests
        self.errors += other.errors
        for index, n in other.latency.items():
            self.latency[index] = self.latency.get(index, 0) + n
        for index, n in other.ttft.items():
            self.ttft[index] = self.ttft.get(index, 0) + n
        self.score_count += other.score_count
        self.score_sum += other.score_sum

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "latency": {str(k): v for k, v in sorted(self.latency.items())},
            "ttft": {str(k): v for k, v in sorted(self.ttft.items())},
            "score_count": self.score_count,
            "score_sum": self.score_sum,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> _Bucket:
        return cls(
            requests=int(data["requests"]),
            errors=int(data["errors"]),
            latency={int(k): int(v) for k, v in data["latency"].items()},
            ttft={int(k): int(v) for k, v in data["ttft"].items()},
            score_count=int(data["score_count"]),
            score_sum=float(data["score_sum"]),
        )


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Request outcomes of one version over ``[start, end]``.

    Quantiles are ``None`` when no sample was recorded; gates decide what too
    few samples mean (inconclusive), never this record.
    """

    start: Seconds
    end: Seconds
    requests: int = 0
    errors: int = 0
    latency_samples: int = 0
    ttft_samples: int = 0
    latency_p50: float | None = None
    latency_p95: float | None = None
    latency_p99: float | None = None
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    ttft_p99: float | None = None

    @property
    def error_rate(self) -> float | None:
        """Errors over requests, or ``None`` without requests."""
        return self.errors / self.requests if self.requests else None


@dataclass(frozen=True, slots=True)
class QualityStats:
    """Evaluator scores of one version over a span: how many, and their mean."""

    samples: int = 0
    mean: float | None = None


class OutcomeWindow:
    """A sliding window of one version's request outcomes and quality scores.

    Time is injected: every method takes ``now`` (the driver's clock). Outcomes
    older than the window are dropped, and so are outcomes that arrive later
    than that (a late report for an expired bucket).
    """

    __slots__ = ("_buckets", "_newest", "bucket_s", "scale", "window_s")

    def __init__(
        self,
        window_s: Seconds = 300.0,
        bucket_s: Seconds = 5.0,
        scale: HistogramScale | None = None,
    ) -> None:
        if bucket_s <= 0 or window_s <= 0:
            raise ValueError("window_s and bucket_s must be > 0")
        if window_s < bucket_s:
            raise ValueError("window_s must be at least one bucket_s")
        self.window_s = float(window_s)
        self.bucket_s = float(bucket_s)
        self.scale = scale or HistogramScale()
        self._buckets: dict[int, _Bucket] = {}
        self._newest: int | None = None

    def __len__(self) -> int:
        """How many buckets are held (bounded by ``window_s / bucket_s + 1``)."""
        return len(self._buckets)

    @property
    def max_buckets(self) -> int:
        """The bound on held buckets."""
        return math.ceil(self.window_s / self.bucket_s) + 1

    def _index(self, t: Seconds) -> int:
        return math.floor(t / self.bucket_s)

    def _bucket(self, now: Seconds) -> _Bucket | None:
        index = self._index(now)
        if index <= self._advance(index) - self.max_buckets:
            return None  # expired before it arrived
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = _Bucket()
        return bucket

    def _advance(self, index: int) -> int:
        """Move the window's head to ``index`` if later, dropping expired buckets."""
        if self._newest is not None and index <= self._newest:
            return self._newest
        self._newest = index
        oldest_kept = index - self.max_buckets + 1
        for stale in [i for i in self._buckets if i < oldest_kept]:
            del self._buckets[stale]
        return index

    def record(
        self,
        now: Seconds,
        *,
        error: bool = False,
        latency_s: float | None = None,
        ttft_s: float | None = None,
    ) -> None:
        """One finished request: whether it failed, its latency and its TTFT if known."""
        bucket = self._bucket(now)
        if bucket is None:
            return
        bucket.requests += 1
        bucket.errors += int(error)
        if latency_s is not None and math.isfinite(latency_s):
            i = self.scale.index(latency_s)
            bucket.latency[i] = bucket.latency.get(i, 0) + 1
        if ttft_s is not None and math.isfinite(ttft_s):
            i = self.scale.index(ttft_s)
            bucket.ttft[i] = bucket.ttft.get(i, 0) + 1

    def record_score(self, now: Seconds, score: float) -> None:
        """One quality score from the evaluator (higher is better)."""
        if not math.isfinite(score):
            return
        bucket = self._bucket(now)
        if bucket is None:
            return
        bucket.score_count += 1
        bucket.score_sum += score

    def span_start(self, now: Seconds, since: Seconds | None = None) -> Seconds:
        """Where a query at ``now`` starts: the window, cut at ``since`` if later."""
        start = now - self.window_s
        return start if since is None else max(start, since)

    def _merged(self, now: Seconds, since: Seconds | None) -> tuple[Seconds, _Bucket]:
        self._advance(self._index(now))
        start = self.span_start(now, since)
        first, last = self._index(start), self._index(now)
        total = _Bucket()
        for index, bucket in self._buckets.items():
            if first <= index <= last:
                total.add(bucket)
        return start, total

    def stats(self, now: Seconds, since: Seconds | None = None) -> WindowStats:
        """Outcomes over the last ``window_s`` seconds, or since ``since`` if later."""
        start, b = self._merged(now, since)
        n_lat, n_ttft = sum(b.latency.values()), sum(b.ttft.values())

        def q(bins: dict[int, int], n: int, p: float) -> float | None:
            return _quantile(self.scale, bins, n, p)

        return WindowStats(
            start=start,
            end=now,
            requests=b.requests,
            errors=b.errors,
            latency_samples=n_lat,
            ttft_samples=n_ttft,
            latency_p50=q(b.latency, n_lat, 0.50),
            latency_p95=q(b.latency, n_lat, 0.95),
            latency_p99=q(b.latency, n_lat, 0.99),
            ttft_p50=q(b.ttft, n_ttft, 0.50),
            ttft_p95=q(b.ttft, n_ttft, 0.95),
            ttft_p99=q(b.ttft, n_ttft, 0.99),
        )

    def quality(self, now: Seconds, since: Seconds | None = None) -> QualityStats:
        """Quality scores over the same span as ``stats``."""
        _, b = self._merged(now, since)
        if not b.score_count:
            return QualityStats()
        return QualityStats(samples=b.score_count, mean=b.score_sum / b.score_count)

    def merge(self, other: OutcomeWindow) -> None:
        """Add ``other``'s buckets into this window (e.g. another replica's window)."""
        if other.bucket_s != self.bucket_s or other.scale != self.scale:
            raise ValueError("can only merge windows with the same bucket_s and scale")
        for index in sorted(other._buckets):
            if index <= self._advance(index) - self.max_buckets:
                continue
            self._buckets.setdefault(index, _Bucket()).add(other._buckets[index])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, so a replica can publish its window through the store."""
        return {
            "window_s": self.window_s,
            "bucket_s": self.bucket_s,
            "scale": {
                "relative_accuracy": self.scale.relative_accuracy,
                "min_value": self.scale.min_value,
                "max_value": self.scale.max_value,
            },
            "buckets": {str(i): b.to_dict() for i, b in sorted(self._buckets.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutcomeWindow:
        """Inverse of ``to_dict``."""
        window = cls(
            window_s=float(data["window_s"]),
            bucket_s=float(data["bucket_s"]),
            scale=HistogramScale(**data["scale"]),
        )
        for key in sorted(data["buckets"], key=int):
            window._advance(int(key))
            window._buckets[int(key)] = _Bucket.from_dict(data["buckets"][key])
        return window


class VersionWindows:
    """One ``OutcomeWindow`` per model version, created on first use.

    The versions come from config, so the map is bounded by it; ``forget``
    drops a version that was removed.
    """

    __slots__ = ("_bucket_s", "_scale", "_window_s", "_windows")

    def __init__(
        self,
        window_s: Seconds = 300.0,
        bucket_s: Seconds = 5.0,
        scale: HistogramScale | None = None,
    ) -> None:
        self._window_s = window_s
        self._bucket_s = bucket_s
        self._scale = scale or HistogramScale()
        self._windows: dict[str, OutcomeWindow] = {}

    def window(self, version: str) -> OutcomeWindow:
        """The window of ``version`` (created empty if new)."""
        window = self._windows.get(version)
        if window is None:
            window = OutcomeWindow(self._window_s, self._bucket_s, self._scale)
            self._windows[version] = window
        return window

    def record(
        self,
        version: str,
        now: Seconds,
        *,
        error: bool = False,
        latency_s: float | None = None,
        ttft_s: float | None = None,
    ) -> None:
        """One finished request served by ``version``."""
        self.window(version).record(now, error=error, latency_s=latency_s, ttft_s=ttft_s)

    def record_score(self, version: str, now: Seconds, score: float) -> None:
        """One evaluator score for a response of ``version``."""
        self.window(version).record_score(now, score)

    def stats(self, version: str, now: Seconds, since: Seconds | None = None) -> WindowStats:
        """``version``'s outcomes over the window (empty stats if never seen)."""
        return self.window(version).stats(now, since)

    def quality(self, version: str, now: Seconds, since: Seconds | None = None) -> QualityStats:
        """``version``'s quality scores over the window."""
        return self.window(version).quality(now, since)

    def versions(self) -> Iterable[str]:
        """Versions with a window."""
        return tuple(self._windows)

    def forget(self, version: str) -> None:
        """Drop ``version``'s window."""
        self._windows.pop(version, None)
