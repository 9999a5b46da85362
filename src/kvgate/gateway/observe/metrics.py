"""Every metric the gateway exports, declared in this one module.

Each gateway app owns a ``GatewayMetrics`` with its own ``CollectorRegistry`` (no
process-wide registry), so several gateways can run side by side in one test.
Per-worker gauges (in flight, health) are read from the worker pool at scrape
time rather than updated on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_CHILDREN_MAX = 4096
"""Labelled children kept by ``GatewayMetrics.child``; past it the cache starts over."""

_M = TypeVar("_M", Counter, Gauge, Histogram)

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)


@dataclass(frozen=True, slots=True)
class WorkerGaugeRow:
    """One worker's values for the scrape-time gauges."""

    worker: str
    model: str
    version: str
    in_flight: int
    health: str
    ejected: bool


class _WorkerCollector(Collector):
    """Reads per-worker gauges from the pool when Prometheus scrapes."""

    def __init__(self, rows: Callable[[], Iterable[WorkerGaugeRow]]) -> None:
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "kvgate_worker_in_flight",
            "Requests in flight through this gateway, per worker.",
            labels=["worker", "model", "version"],
        )
        healthy = GaugeMetricFamily(
            "kvgate_worker_healthy",
            "1 when the worker takes traffic (healthy or degraded), else 0.",
            labels=["worker", "model", "version", "state"],
        )
        for row in self._rows():
            in_flight.add_metric([row.worker, row.model, row.version], row.in_flight)
            healthy.add_metric(
                [row.worker, row.model, row.version, row.health],
                0.0 if row.health in ("ejected", "draining") else 1.0,
            )
        yield in_flight
        yield healthy


class GatewayMetrics:
    """The gateway's Prometheus metrics, in a registry of their own."""

    def __init__(self, worker_rows: Callable[[], Iterable[WorkerGaugeRow]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "kvgate_requests_total",
            "Requests answered, by model, version, worker, status code and route reason.",
            ["model", "version", "worker", "code", "reason"],
            registry=r,
        )
        self.request_duration = Histogram(
            "kvgate_request_duration_seconds",
            "Whole request time as the gateway saw it.",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "kvgate_time_to_first_token_seconds",
            "Time from request arrival to the first response byte (first chunk for streams).",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "kvgate_retries_total",
            "Attempts retried on another worker.",
            ["model"],
            registry=r,
        )
        self.retries_denied = Counter(
            "kvgate_retries_budget_exhausted_total",
            "Retries refused because the retry budget was spent.",
            ["model"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "kvgate_upstream_errors_total",
            "Failed upstream attempts, by worker and kind (unavailable, timeout, status, broken).",
            ["worker", "kind"],
            registry=r,
        )
        self.sheds = Counter(
            "kvgate_shed_total",
            "Requests refused with 429/503, by reason and priority.",
            ["reason", "priority"],
            registry=r,
        )
        self.affinity = Counter(
            "kvgate_affinity_lookups_total",
            "Session-key lookups in the store, by result (hit, miss, error).",
            ["result"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "kvgate_queue_wait_seconds",
            "Time spent in the admission queue waiting for a free worker.",
            ["priority"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "kvgate_prompt_tokens_total",
            "Prompt tokens reported in responses' usage.",
            ["model", "worker"],
            registry=r,
        )
        self.cached_tokens = Counter(
            "kvgate_cached_tokens_total",
            "Prompt tokens served from the worker's prefix cache (usage cached_tokens).",
            ["model", "worker"],
            registry=r,
        )
        self.completion_tokens = Counter(
            "kvgate_completion_tokens_total",
            "Completion tokens reported in responses' usage.",
            ["model", "worker"],
            registry=r,
        )
        self.store_errors = Counter(
            "kvgate_store_errors_total",
            "Affinity store operations that failed (never fail a request).",
            ["op"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "kvgate_client_disconnects_total",
            "Requests whose client went away before the response finished.",
            ["model"],
            registry=r,
        )
        # Memory pressure (gateway/pressure.py) and drains (gateway/drain.py).
        self.pressure_level = Gauge(
            "kvgate_worker_pressure_level",
            "Memory pressure per worker: 0 normal, 1 soft (no new sessions), 2 hard (move away).",
            ["worker"],
            registry=r,
        )
        self.pressure_seconds = Counter(
            "kvgate_worker_pressure_seconds_total",
            "Seconds a worker spent at or above each watermark (soft, hard).",
            ["worker", "level"],
            registry=r,
        )
        self.preemptions_seen = Counter(
            "kvgate_worker_preemptions_total",
            "Preemptions the worker reported (increase of its own counter between scrapes).",
            ["worker"],
            registry=r,
        )
        self.migrations = Counter(
            "kvgate_migrations_total",
            "Migration rounds that moved sessions off a worker, by reason.",
            ["worker", "reason"],
            registry=r,
        )
        self.sessions_moved = Counter(
            "kvgate_sessions_moved_total",
            "Sessions whose affinity was rewritten to another worker, by reason.",
            ["worker", "reason"],
            registry=r,
        )
        self.offloads = Counter(
            "kvgate_offloads_total",
            "KV offload calls to a worker, by reason and result (ok, error).",
            ["worker", "reason", "result"],
            registry=r,
        )
        self.offloaded_blocks = Counter(
            "kvgate_offloaded_blocks_total",
            "KV blocks a worker reported moving to its offload tier at the gateway's request.",
            ["worker"],
            registry=r,
        )
        self.drains = Counter(
            "kvgate_worker_drains_total",
            "Drains started, by cause (admin, temperature).",
            ["worker", "cause"],
            registry=r,
        )
        self.rollout = RolloutMetrics(r)
        self.slots = SlotMetrics(r)
        if worker_rows is not None:
            r.register(_WorkerCollector(worker_rows))
        self._children: dict[tuple[object, tuple[str, ...]], object] = {}

    def child(self, metric: _M, *values: str) -> _M:
        """``metric.labels(*values)``, cached: the request path's way to label a series.

        ``labels()`` validates, joins and locks on every call (microseconds); a
        request updates several series. The label values on the request path come
        from config and the fleet (models, versions, workers, codes, reasons), so
        the cache stays small; ``_CHILDREN_MAX`` bounds it anyway.
        """
        key = (metric, values)
        found = self._children.get(key)
        if found is None:
            if len(self._children) >= _CHILDREN_MAX:
                self._children.clear()
            found = self._children[key] = metric.labels(*values)
        return found  # type: ignore[return-value]

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)


class SlotMetrics:
    """llama.cpp slot offload, restore and migration (``GatewayMetrics.slots``).

    A *save* writes an idle session's slot to disk before another session takes
    the slot (an offload); a *restore* loads it back when the session returns; a
    *migration* saves it on one worker and restores it on another. ``tier`` says
    where each turn's KV came from (slot, disk, migrated, recompute, fallback).
    """

    def __init__(self, r: CollectorRegistry) -> None:
        self.saves = Counter(
            "kvgate_slot_saves_total",
            "Slots saved to disk (offloads), by worker and result (ok, error).",
            ["worker", "result"],
            registry=r,
        )
        self.restores = Counter(
            "kvgate_slot_restores_total",
            "Saved slots restored into a worker's slot, by worker and result (ok, error).",
            ["worker", "result"],
            registry=r,
        )
        self.migrations = Counter(
            "kvgate_slot_migrations_total",
            "Sessions moved between workers with their KV (save there, restore here).",
            ["from_worker", "to_worker", "result"],
            registry=r,
        )
        self.fallbacks = Counter(
            "kvgate_slot_recompute_fallbacks_total",
            "Turns recomputed because a restore or a migration failed, by worker and step.",
            ["worker", "step"],
            registry=r,
        )
        self.turns = Counter(
            "kvgate_slot_turns_total",
            "Turns sent to llama.cpp workers, by where their KV came from (tier).",
            ["worker", "tier"],
            registry=r,
        )
        self.saved_bytes = Gauge(
            "kvgate_slot_saved_bytes",
            "Bytes of saved slots the gateway keeps on disk.",
            registry=r,
        )
        self.saved_sessions = Gauge(
            "kvgate_slot_saved_sessions",
            "Sessions whose KV is saved on disk.",
            registry=r,
        )
        buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
        self.save_seconds = Histogram(
            "kvgate_slot_save_seconds",
            "Seconds to save a slot, as the gateway waited for it.",
            buckets=buckets,
            registry=r,
        )
        self.restore_seconds = Histogram(
            "kvgate_slot_restore_seconds",
            "Seconds to restore a slot, as the gateway waited for it.",
            buckets=buckets,
            registry=r,
        )


class RolloutMetrics:
    """Per-version traffic and rollout metrics (``GatewayMetrics.rollout``).

    Request rate and error rate per version: ``kvgate_version_attempts_total``
    (every attempt on a worker of the version, ``outcome`` ok or error, as the
    canary gates count them); latency and TTFT histograms per version are
    ``kvgate_request_duration_seconds`` and ``kvgate_time_to_first_token_seconds``.
    """

    def __init__(self, r: CollectorRegistry) -> None:
        self.attempts = Counter(
            "kvgate_version_attempts_total",
            "Attempts on workers of each model version, by outcome (ok, error).",
            ["model", "version", "outcome"],
            registry=r,
        )
        self.weight = Gauge(
            "kvgate_version_weight_percent",
            "Share of new traffic each model version receives, in percent.",
            ["model", "version"],
            registry=r,
        )
        self.state = Gauge(
            "kvgate_rollout_state",
            "1 for the state each rollout is in (pending, progressing, paused, ...), else 0.",
            ["rollout", "state"],
            registry=r,
        )
        self.step = Gauge(
            "kvgate_rollout_step",
            "The step each rollout is at, counting from 1.",
            ["rollout"],
            registry=r,
        )
        self.canary_weight = Gauge(
            "kvgate_rollout_canary_weight_percent",
            "The canary's weight in each rollout, in percent.",
            ["rollout"],
            registry=r,
        )
        self.gate_value = Gauge(
            "kvgate_rollout_gate_value",
            "Each gate's value at the last evaluation (ratios for *_vs_baseline gates).",
            ["rollout", "gate"],
            registry=r,
        )
        self.evaluations = Counter(
            "kvgate_rollout_evaluations_total",
            "Rollout evaluations, by result (waiting, advanced, inconclusive, rolled_back, ...).",
            ["rollout", "result"],
            registry=r,
        )
        self.rollbacks = Counter(
            "kvgate_rollout_rollbacks_total",
            "Rollouts rolled back automatically, by the gate that failed.",
            ["rollout", "gate"],
            registry=r,
        )
        self.alerts = Counter(
            "kvgate_rollout_alerts_total",
            "Rollout alerts raised, by reason, and whether the webhook took them.",
            ["rollout", "reason", "delivery"],
            registry=r,
        )
        self.quality_scores = Counter(
            "kvgate_quality_samples_total",
            "Sampled responses sent to the quality evaluator, by result (scored, dropped, failed).",
            ["model", "version", "result"],
            registry=r,
        )
        self.leader = Gauge(
            "kvgate_rollout_controller_leader",
            "1 while this replica holds the rollout controller lease.",
            registry=r,
        )
