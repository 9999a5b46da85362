"""What one run of a workload measured (simulated or live): latencies, cache hits, load, sheds.

The recorder keeps a few numbers per finished request (for exact percentiles)
and a per-worker load series sampled at scrape instants, thinned by halving
whenever it grows past ``max_samples`` so long runs stay bounded. Its summary is
over the requests answered; ``counting_unanswered`` gives the figures where a
request refused or failed counts too (a miss, and a TTFT that never came): the
judge's, so that refusing work cannot make a router look faster.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.extras import require
from kvgate.types import Seconds


def _percentile(values: array[float], q: float) -> float:
    if not values:
        return 0.0
    np = require("numpy", "sim")  # not at import: the gateway imports this module's users
    return float(np.percentile(np.frombuffer(values, dtype=np.float64), q))


def unbounded_percentile(values: Sequence[float], unbounded: int, q: float) -> float:
    """The ``q``-th percentile of ``values`` and ``unbounded`` more at +inf (requests never
    answered sort last), interpolated as numpy's default: +inf once the rank reaches one of
    them, so a p99 over a run with more than 1% unanswered is +inf. 0 with no values at all."""
    if not unbounded:
        return _percentile(array("d", values), q)
    ordered = sorted(values)

    def at(i: int) -> float:
        return ordered[i] if i < len(ordered) else math.inf

    rank = (len(ordered) + unbounded - 1) * q / 100
    low = math.floor(rank)
    if rank == low:
        return at(low)
    upper = at(low + 1)
    if math.isinf(upper):
        return math.inf
    return ordered[low] + (upper - ordered[low]) * (rank - low)


def _r(value: float, digits: int = 6) -> float:
    """Rounded for the report: stable text, no spurious precision."""
    return round(value, digits) if math.isfinite(value) else 0.0


@dataclass
class LoadSeries:
    """Per-worker in-flight counts and KV usage over time, at most ``max_samples`` points."""

    workers: int
    max_samples: int = 1_000
    stride: int = 1
    _seen: int = 0
    times: list[float] = field(default_factory=list)
    in_flight: list[list[int]] = field(default_factory=list)
    kv_usage: list[list[float]] = field(default_factory=list)

    def sample(self, now: Seconds, in_flight: list[int], kv_usage: list[float]) -> None:
        """Offer one sample; every ``stride``-th is kept."""
        self._seen += 1
        if (self._seen - 1) % self.stride:
            return
        self.times.append(now)
        self.in_flight.append(in_flight)
        self.kv_usage.append(kv_usage)
        if len(self.times) >= self.max_samples:
            # Keep every other point and sample half as often from now on.
            self.times = self.times[::2]
            self.in_flight = self.in_flight[::2]
            self.kv_usage = self.kv_usage[::2]
            self.stride *= 2

    def to_json(self) -> dict[str, Any]:
        """Times and per-worker series (``in_flight[i]`` is worker i's series)."""
        return {
            "times": [_r(t, 3) for t in self.times],
            "in_flight": [[row[i] for row in self.in_flight] for i in range(self.workers)],
            "kv_usage": [[_r(row[i], 4) for row in self.kv_usage] for i in range(self.workers)],
        }


class RunRecorder:
    """Collects one run's measurements as events happen."""

    def __init__(self, worker_ids: list[str], max_samples: int = 1_000) -> None:
        self.worker_ids = worker_ids
        self.ttft: array[float] = array("d")
        self.e2e: array[float] = array("d")
        self.queue: array[float] = array("d")
        self.ttft_floor: array[float] = array("d")
        self.ttft_return: array[float] = array("d")
        """TTFT of the turns that brought a tool's result back (an agent's later turns)."""
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.output_tokens = 0
        self.offered = 0
        self.finished = 0
        self.preemptions = 0
        self.migrations = 0
        self.sheds: Counter[str] = Counter()
        self.unanswered = 0
        """Refused or failed requests that a worker could have served (``unanswered_request``)."""
        self.unanswered_prompt_tokens = 0
        self.unanswered_returns = 0
        self.reasons: Counter[str] = Counter()
        self.served = [0] * len(worker_ids)
        # Per finished request, when it arrived and where it was served (``shares``).
        self.arrivals: array[float] = array("d")
        self.placed: array[int] = array("l")
        self.first_arrival: Seconds | None = None
        self.last_finish: Seconds = 0.0
        self.load = LoadSeries(len(worker_ids), max_samples)

    def arrived(self, now: Seconds) -> None:
        """One request reached the gateway."""
        self.offered += 1
        if self.first_arrival is None:
            self.first_arrival = now

    def routed(self, reason: str, migrated: bool) -> None:
        """A decision placed a request (``migrated``: it moved a session's affinity)."""
        self.reasons[reason] += 1
        if migrated:
            self.migrations += 1

    def shed(self, reason: str) -> None:
        """A request was refused."""
        self.sheds[reason] += 1

    def unanswered_request(self, prompt_tokens: int, *, returning: bool = False) -> None:
        """A request got no answer (refused or failed) though the fleet could have served it:
        ``counting_unanswered`` counts its ``prompt_tokens`` as missed and its TTFT as +inf."""
        self.unanswered += 1
        self.unanswered_prompt_tokens += prompt_tokens
        if returning:
            self.unanswered_returns += 1

    def finish(
        self,
        worker: int,
        *,
        ttft: Seconds,
        e2e: Seconds,
        queued: Seconds,
        prompt_tokens: int,
        cached_tokens: int,
        output_tokens: int,
        now: Seconds,
        ttft_floor: Seconds | None = None,
        returning: bool = False,
    ) -> None:
        """A request completed on worker index ``worker``; ``ttft_floor``: its TTFT had
        it been prefilled alone with the cache it got (when the fleet's engine model is known);
        ``returning``: the turn brought a tool's result back."""
        self.finished += 1
        self.ttft.append(ttft)
        if returning:
            self.ttft_return.append(ttft)
        if ttft_floor is not None:
            self.ttft_floor.append(ttft_floor)
        self.e2e.append(e2e)
        self.queue.append(queued)
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self.output_tokens += output_tokens
        self.served[worker] += 1
        self.arrivals.append(now - e2e)
        self.placed.append(worker)
        self.last_finish = max(self.last_finish, now)

    def shares(self, start: Seconds, end: Seconds = math.inf) -> list[float]:
        """Each worker's share of the finished requests that arrived in ``[start, end)``
        (all zero when none did): where a policy sent the work over a window of the run."""
        counts = [0] * len(self.worker_ids)
        for at, worker in zip(self.arrivals, self.placed, strict=True):
            if start <= at < end:
                counts[worker] += 1
        total = sum(counts)
        return [c / total if total else 0.0 for c in counts]

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache, as a fraction of prompt tokens."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def counting_unanswered(
        self, ttft: Sequence[float] | None = None, ttft_return: Sequence[float] | None = None
    ) -> dict[str, float]:
        """Hit rate and TTFT percentiles over every request, the unanswered too: all of an
        unanswered request's prompt tokens are a miss and its TTFT is +inf (it sorts last).
        ``ttft``/``ttft_return``: the answered requests' TTFTs on another clock (a worker's own)
        instead of the recorded ones. Seconds, rounded; +inf stays +inf."""
        ttft = self.ttft if ttft is None else ttft
        returns = self.ttft_return if ttft_return is None else ttft_return
        prompt = self.prompt_tokens + self.unanswered_prompt_tokens
        figures = {"hit_rate": self.cached_tokens / prompt if prompt else 0.0}
        for q in (50, 99):
            figures[f"ttft_p{q}"] = unbounded_percentile(ttft, self.unanswered, q)
        for q in (50, 99):
            figures[f"ttft_return_p{q}"] = unbounded_percentile(returns, self.unanswered_returns, q)
        return {k: round(v, 6) if math.isfinite(v) else v for k, v in figures.items()}

    def summary(self, bound_hit_rate: float | None = None) -> dict[str, Any]:
        """The run's figures, JSON-ready (seconds for times)."""
        duration = self.last_finish - (self.first_arrival or 0.0)
        served = self.served
        mean = sum(served) / len(served) if served else 0.0
        std = math.sqrt(sum((s - mean) ** 2 for s in served) / len(served)) if served else 0.0
        hit = self.hit_rate
        out: dict[str, Any] = {
            "requests": self.offered,
            "finished": self.finished,
            "shed": sum(self.sheds.values()),
            "sheds": dict(sorted(self.sheds.items())),
            "duration_s": _r(duration, 3),
            "throughput": _r(self.finished / duration if duration > 0 else 0.0, 4),
            "output_tokens_per_s": _r(self.output_tokens / duration if duration > 0 else 0.0, 2),
            "hit_rate": _r(hit),
            "hit_rate_of_bound": _r(hit / bound_hit_rate) if bound_hit_rate else None,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "ttft_mean": _r(sum(self.ttft) / len(self.ttft) if self.ttft else 0.0),
            "ttft_p50": _r(_percentile(self.ttft, 50)),
            "ttft_p90": _r(_percentile(self.ttft, 90)),
            "ttft_p99": _r(_percentile(self.ttft, 99)),
            "returns": len(self.ttft_return),
            "ttft_return_p50": _r(_percentile(self.ttft_return, 50)),
            "ttft_return_p99": _r(_percentile(self.ttft_return, 99)),
            "e2e_p50": _r(_percentile(self.e2e, 50)),
            "e2e_p99": _r(_percentile(self.e2e, 99)),
            "queue_mean": _r(sum(self.queue) / len(self.queue) if self.queue else 0.0),
            "queue_p99": _r(_percentile(self.queue, 99)),
            "load_max_over_mean": _r(max(served) / mean if mean else 0.0, 4),
            "load_cv": _r(std / mean if mean else 0.0, 4),
            "served": dict(zip(self.worker_ids, served, strict=True)),
            "preemptions": self.preemptions,
            "migrations": self.migrations,
            "reasons": dict(sorted(self.reasons.items())),
        }
        if self.ttft_floor:
            # The p99 with no queueing at the same cache hits: what placement cannot cut.
            out["ttft_floor_p99"] = _r(_percentile(self.ttft_floor, 99))
        return out

    def ttft_sorted(self, points: int = 200) -> list[float]:
        """TTFT quantiles at ``points`` evenly spaced levels (for the CDF plot)."""
        if not self.ttft:
            return []
        np = require("numpy", "sim")
        values = np.frombuffer(self.ttft, dtype=np.float64)
        levels = np.linspace(0, 100, points)
        return [_r(float(v)) for v in np.percentile(values, levels)]
