"""Where the request path reports each attempt's outcome, per model version.

Called synchronously from the proxy, so it must stay cheap: a counter, one
dict lookup and, only for a model under rollout, a bucket update in that
rollout's ``VersionWindows``. The rollout controller reads the windows off the
request path. Every attempt on a worker counts (a 5xx that a retry hid from the
client still counts against the worker's version), so the canary's error rate
is the rate its workers failed at.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvgate.core.window import VersionWindows
from kvgate.gateway.observe.metrics import CounterCell, RolloutMetrics

SampleSink = Callable[[str, str, bytes, bytes], bool]
"""Takes (model, version, request body, response body); False when it dropped it."""


@dataclass(frozen=True, slots=True)
class Watch:
    """One active rollout's interest in its model's traffic.

    ``sample_version`` is the canary when the rollout has a quality gate: that
    share of its responses goes to the evaluator.
    """

    windows: VersionWindows
    versions: frozenset[str]
    sample_version: str | None = None
    sample_rate: float = 0.0


class OutcomeRecorder:
    """Per-version outcome counters, plus windows for models under rollout."""

    def __init__(
        self,
        metrics: RolloutMetrics,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.metrics = metrics
        self.clock = clock
        self.rng = rng or random.Random(0)
        self.sink: SampleSink | None = None
        self._watches: dict[str, Watch] = {}
        # Labelled counter series as cells (``observe.cells``), cached: ``labels()`` costs
        # microseconds per call and ``Counter.inc`` five Python calls, once a request.
        # Bounded by models x versions x 2 (both come from config and workers).
        self._attempts: dict[tuple[str, str, bool], CounterCell] = {}

    def _count(self, model: str, version: str, error: bool) -> None:
        child = self._attempts.get((model, version, error))
        if child is None:
            outcome = "error" if error else "ok"
            child = self._attempts[model, version, error] = CounterCell(
                self.metrics.attempts.labels(model, version, outcome)
            )
        child.inc()

    def watch(self, model: str, watch: Watch) -> None:
        """Record ``model``'s outcomes into ``watch.windows`` from now on."""
        self._watches[model] = watch

    def unwatch(self, model: str) -> None:
        """Stop recording ``model``'s outcomes into windows."""
        self._watches.pop(model, None)

    def watching(self, model: str) -> Watch | None:
        """The watch on ``model``, if a rollout is running on it."""
        return self._watches.get(model)

    def attempt_failed(self, model: str, version: str) -> None:
        """An attempt on a worker of ``version`` failed (unreachable, 5xx, timeout)."""
        self._count(model, version, True)
        watch = self._watches.get(model)
        if watch is not None and version in watch.versions:
            watch.windows.record(version, self.clock(), error=True)

    def finished(
        self,
        model: str,
        version: str,
        *,
        error: bool,
        latency_s: float | None,
        ttft_s: float | None,
    ) -> None:
        """A response from a worker of ``version`` reached the client (or broke off)."""
        self._count(model, version, error)
        watch = self._watches.get(model)
        if watch is not None and version in watch.versions:
            watch.windows.record(
                version, self.clock(), error=error, latency_s=latency_s, ttft_s=ttft_s
            )

    def wants_sample(self, model: str, version: str) -> bool:
        """True when this response should go to the quality evaluator."""
        watch = self._watches.get(model)
        if watch is None or watch.sample_version != version or self.sink is None:
            return False
        return self.rng.random() < watch.sample_rate

    def sample(self, model: str, version: str, request: bytes, response: bytes) -> None:
        """Hand one sampled response to the evaluator (dropped if it is busy)."""
        sink = self.sink
        if sink is None:
            return
        taken = sink(model, version, request, response)
        self.metrics.quality_scores.labels(model, version, "queued" if taken else "dropped").inc()

    def record_score(self, model: str, version: str, score: float) -> None:
        """An evaluator's score for a response of ``version``."""
        watch = self._watches.get(model)
        if watch is not None and version in watch.versions:
            watch.windows.record_score(version, self.clock(), score)
