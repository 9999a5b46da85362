"""Every metric the gateway exports, declared in this one module.

Each gateway app owns a ``GatewayMetrics`` with its own ``CollectorRegistry`` (no
process-wide registry), so several gateways can run side by side in one test.
Per-worker gauges (what routing sees: in flight, health, KV usage, queue, pressure,
GPU memory and temperature, scrape age) are read from the worker pool at scrape
time rather than updated on the hot path. ``*_created`` series are left out
unless ``created=True``. This module is the declarations (names, help, labels,
buckets, what a scrape-time value is read from); ``observe.exposition`` is the
machinery that collects and renders them, and names nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvgate.core.fleet import ROUTABLE_HEALTH, Health, Pressure
from kvgate.core.speed import SpeedReport
from kvgate.gateway.observe.cells import CellCache

# Re-exported: the other planes hold cells, and ``observe.metrics`` is their interface.
from kvgate.gateway.observe.cells import CounterCell as CounterCell  # noqa: PLC0414
from kvgate.gateway.observe.cells import HistogramCell as HistogramCell  # noqa: PLC0414
from kvgate.gateway.observe.exposition import (
    KeyedCollector,
    RowCollector,
    RowGauge,
    ValueCollector,
    render,
)
from kvgate.store.health import StoreHealth

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_CHILDREN_MAX = 4096
"""Labelled series kept by ``GatewayMetrics.cells``; past it the cache starts over."""


_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0, 120.0)  # fmt: skip


# -- what routing sees, per worker (issue 14) ---------------------------------------
#
# These gauges are read from the worker pool when Prometheus scrapes (a custom
# collector), so they cost nothing per request. Health is a value, never a label
# that changes over time: ``kvgate_worker_healthy`` is 0/1 and
# ``kvgate_worker_health_state`` has one series per state, 0 or 1, that never
# disappears while the worker is in the pool.

HEALTH_STATES = tuple(h.value for h in Health)
"""Every health state: one ``kvgate_worker_health_state`` series each, per worker."""

PRESSURE_VALUES = {Pressure.NORMAL.value: 0.0, Pressure.SOFT.value: 1.0, Pressure.HARD.value: 2.0}
"""``kvgate_worker_*pressure_level`` values for each ``core.fleet.Pressure`` level."""

_ROUTABLE = frozenset(h.value for h in ROUTABLE_HEALTH)

_MIB = 1024.0 * 1024.0

_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
"""Inter-token latency lives between ~5 ms (small models) and ~150 ms (loaded GPUs)."""


@dataclass(frozen=True, slots=True)
class WorkerGaugeRow:
    """One worker's values for the scrape-time gauges; ``None`` means unknown.

    Scraped readings (``running`` .. ``gpu_mem_total_mib``) are the last scrape's,
    however old: ``scrape_age_s`` and ``signals_fresh`` say whether routing still
    believes them (stale readings count as unknown there).
    """

    worker: str
    model: str
    version: str
    in_flight: int
    health: str
    ejected: bool
    max_in_flight: int = 0
    pressure: str = "normal"
    """The level routing sees: the scraped level raised by the in-flight KV estimate."""
    kv_in_flight_tokens: int = 0
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    kv_capacity_tokens: int | None = None
    """The worker's KV-cache size in tokens (configuration: it does not go stale)."""
    gpu_temp_c: float | None = None
    gpu_mem_used_mib: float | None = None
    gpu_mem_total_mib: float | None = None
    scrape_age_s: float | None = None
    signals_fresh: bool = False


def _mib(value: float | None) -> float | None:
    return None if value is None else value * _MIB


def _free_bytes(row: WorkerGaugeRow) -> float | None:
    used, total = row.gpu_mem_used_mib, row.gpu_mem_total_mib
    return None if used is None or total is None else max(0.0, total - used) * _MIB


WORKER_LABELS = ("worker", "model", "version")


def _worker_labels(row: WorkerGaugeRow) -> list[str]:
    return [row.worker, row.model, row.version]


WORKER_GAUGES: tuple[RowGauge[WorkerGaugeRow], ...] = (
    ("kvgate_worker_in_flight", "Requests in flight here, per worker.", None,
     lambda r: r.in_flight),
    ("kvgate_worker_max_in_flight", "In-flight limit: past it, full.", None,
     lambda r: r.max_in_flight),
    ("kvgate_worker_healthy", "1: takes traffic (healthy, degraded).", None,
     lambda r: 1.0 if r.health in _ROUTABLE else 0.0),
    ("kvgate_worker_health_state",
     "1 for the health state the worker is in, 0 for the others (healthy, degraded, "
     "draining, ejected).", "state",
     lambda r: {state: 1.0 if r.health == state else 0.0 for state in HEALTH_STATES}),
    ("kvgate_worker_routing_pressure_level",
     "Memory pressure routing sees: 0 normal, 1 soft, 2 hard (the scraped level "
     "raised by the gateway's in-flight KV estimate).", None,
     lambda r: PRESSURE_VALUES.get(r.pressure, 0.0)),
    ("kvgate_worker_kv_in_flight_tokens",
     "KV tokens the requests in flight here will hold at their end (the gateway's "
     "estimate).", None, lambda r: r.kv_in_flight_tokens),
    ("kvgate_worker_running_requests", "Requests the worker reports running.", None,
     lambda r: r.running),
    ("kvgate_worker_waiting_requests", "Requests the worker reports waiting.", None,
     lambda r: r.waiting),
    ("kvgate_worker_kv_usage_ratio", "KV-cache usage the worker reports, 0..1.", None,
     lambda r: r.kv_usage),
    ("kvgate_worker_kv_capacity_tokens", "The worker's KV-cache size in tokens.", None,
     lambda r: r.kv_capacity_tokens),
    ("kvgate_worker_gpu_temperature_celsius", "GPU temperature (DCGM), worst GPU.", None,
     lambda r: r.gpu_temp_c),
    ("kvgate_worker_gpu_memory_used_bytes", "GPU memory used (DCGM), fullest GPU.", None,
     lambda r: _mib(r.gpu_mem_used_mib)),
    ("kvgate_worker_gpu_memory_free_bytes", "GPU memory free (DCGM), fullest GPU.", None,
     _free_bytes),
    ("kvgate_worker_scrape_age_seconds", "Seconds since the last good scrape.", None,
     lambda r: r.scrape_age_s),
    ("kvgate_worker_signals_fresh",
     "1 when the last scrape is younger than health.stale_after (routing uses it).", None,
     lambda r: 1.0 if r.signals_fresh else 0.0),
)  # fmt: skip
"""What routing sees, per worker, read from the pool when Prometheus scrapes: name, help,
the extra label, the row's value (``None``: unknown, the sample left out)."""


class GatewayMetrics:
    """The gateway's Prometheus metrics, in a registry of their own."""

    def __init__(
        self,
        worker_rows: Callable[[], Iterable[WorkerGaugeRow]] | None = None,
        *,
        created: bool = False,
    ) -> None:
        self.created = created
        """Export the ``*_created`` series (off by default: they were ~40% of the page)."""
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        # Every metric below is in this gateway's registry.
        counter, gauge = partial(Counter, registry=r), partial(Gauge, registry=r)
        histogram = partial(Histogram, registry=r)
        self.requests = counter(
            "kvgate_requests_total",
            "Requests answered, by model, version, worker, status code and route reason.",
            ["model", "version", "worker", "code", "reason"],
        )
        self.request_duration = histogram(
            "kvgate_request_duration_seconds",
            "Whole request time as the gateway saw it (end to end), by worker and version.",
            ["model", "version", "worker"],
            buckets=_LATENCY_BUCKETS,
        )
        self.ttft = histogram(
            "kvgate_time_to_first_token_seconds",
            "Time from request arrival to the first response byte (first chunk for streams).",
            ["model", "version", "worker"],
            buckets=_LATENCY_BUCKETS,
        )
        self.retries = counter(
            "kvgate_retries_total",
            "Attempts retried on another worker.",
            ["model"],
        )
        self.retries_denied = counter(
            "kvgate_retries_budget_exhausted_total",
            "Retries refused because the retry budget was spent.",
            ["model"],
        )
        self.upstream_errors = counter(
            "kvgate_upstream_errors_total",
            "Failed upstream attempts, by worker and kind (unavailable, timeout, status, broken).",
            ["worker", "kind"],
        )
        self.sheds = counter(
            "kvgate_shed_total",
            "Requests refused with 429/503, by reason and priority.",
            ["reason", "priority"],
        )
        self.warm_ups = counter(
            "kvgate_warm_ups_total",
            "Shared prefixes the gateway computed ahead on an idle worker (core.warmup), "
            "by outcome (sent, error, cancelled, skipped: no body to cut it from).",
            ["outcome"],
        )
        self.warm_up_tokens = counter(
            "kvgate_warm_up_prefill_tokens_total",
            "Prompt tokens warm-ups made workers compute (uncached): prefill no client asked for.",
        )
        self.affinity = counter(
            "kvgate_affinity_lookups_total",
            "Session-key lookups in the store, by result (hit, miss, error).",
            ["result"],
        )
        self.queue_wait = histogram(
            "kvgate_queue_wait_seconds",
            "Time spent in the admission queue waiting for a free worker.",
            ["priority"],
            buckets=_LATENCY_BUCKETS,
        )
        self.prompt_tokens = counter(
            "kvgate_prompt_tokens_total",
            "Prompt tokens reported in responses' usage.",
            ["model", "worker"],
        )
        self.cached_tokens = counter(
            "kvgate_cached_tokens_total",
            "Prompt tokens served from the worker's prefix cache (usage cached_tokens).",
            ["model", "worker"],
        )
        self.completion_tokens = counter(
            "kvgate_completion_tokens_total",
            "Completion tokens reported in responses' usage.",
            ["model", "worker"],
        )
        self.store_errors = counter(
            "kvgate_store_errors_total",
            "Affinity store operations that failed (never fail a request).",
            ["op"],
        )
        self.client_disconnects = counter(
            "kvgate_client_disconnects_total",
            "Requests whose client went away before the response finished.",
            ["model"],
        )
        # Memory pressure (gateway/pressure.py) and drains (gateway/drain.py).
        self.pressure_level = gauge(
            "kvgate_worker_pressure_level",
            "Memory pressure per worker: 0 normal, 1 soft (no new sessions), 2 hard (move away).",
            ["worker"],
        )
        self.pressure_seconds = counter(
            "kvgate_worker_pressure_seconds_total",
            "Seconds a worker spent at or above each watermark (soft, hard).",
            ["worker", "level"],
        )
        self.preemptions_seen = counter(
            "kvgate_worker_preemptions_total",
            "Preemptions the worker reported (increase of its own counter between scrapes).",
            ["worker"],
        )
        self.migrations = counter(
            "kvgate_migrations_total",
            "Migration rounds that moved sessions off a worker, by reason.",
            ["worker", "reason"],
        )
        self.sessions_moved = counter(
            "kvgate_sessions_moved_total",
            "Sessions whose affinity was rewritten to another worker, by reason.",
            ["worker", "reason"],
        )
        self.offloads = counter(
            "kvgate_offloads_total",
            "KV offload calls to a worker, by reason and result (ok, error).",
            ["worker", "reason", "result"],
        )
        self.offloaded_blocks = counter(
            "kvgate_offloaded_blocks_total",
            "KV blocks a worker reported moving to its offload tier at the gateway's request.",
            ["worker"],
        )
        self.drains = counter(
            "kvgate_worker_drains_total",
            "Drains started, by cause (admin, temperature).",
            ["worker", "cause"],
        )
        self.rollout = RolloutMetrics(r)
        self.slots = SlotMetrics(r)
        self.inter_token_latency = histogram(
            "kvgate_inter_token_latency_seconds",
            "Mean time between output tokens of one streamed response, as the gateway saw "
            "it: (last chunk - first chunk) / (completion tokens - 1).",
            ["model", "version", "worker"],
            buckets=_ITL_BUCKETS,
        )
        self.inter_token_latency_max = histogram(
            "kvgate_inter_token_latency_max_seconds",
            "A stream's longest gap between two chunks after its first: where a stall shows.",
            ["model", "version", "worker"],
            buckets=(*_ITL_BUCKETS, 2.5, 5.0, 10.0, 30.0),  # a stall runs to seconds
        )
        self.decisions = counter(
            "kvgate_route_decisions_total",
            "Placements the router made (every attempt, retries too), by the policy's reason.",
            ["model", "version", "worker", "reason"],
        )
        if worker_rows is not None:
            r.register(RowCollector(worker_rows, _worker_labels, WORKER_LABELS, WORKER_GAUGES))
        self.cells = CellCache(_CHILDREN_MAX)
        """The request path's handles on labelled series (``observe.cells``)."""

    # -- store health (issue 13) ------------------------------------------------

    def watch_store(self, health: Callable[[], StoreHealth]) -> None:
        """Export the affinity store's health counters, read when Prometheus scrapes."""
        self.registry.register(ValueCollector(lambda: _store_readings(health())))

    def watch_tool_calls(self, reading: Callable[[], ToolCallReading]) -> None:
        """Export the sessions away on a tool call (``control.toolcalls``), read at scrape."""
        self.registry.register(ValueCollector(lambda: _tool_call_readings(reading())))

    def watch_speeds(self, speeds: Callable[[], Mapping[str, SpeedReport]]) -> None:
        """Export each worker's learned speed (``Policy.speeds``), read when Prometheus scrapes."""
        self.registry.register(KeyedCollector(speeds, "worker", _SPEED_GAUGES))

    def render(self) -> bytes:
        """The text exposition of every metric (``*_created`` only when asked for)."""
        return render(self.registry, created=self.created)


_STORE_COUNTERS = (
    ("kvgate_store_backend_errors", "errors_total",
     "Failed round trips to the store's backend (Redis), probes included."),
    ("kvgate_store_degraded_episodes", "degraded_total",
     "Times the store entered degraded mode (backend outages seen)."),
    ("kvgate_store_fallbacks", "fallbacks_total",
     "Store calls answered from the local fallback map during outages."),
    ("kvgate_store_resyncs", "resyncs_total",
     "Outages recovered from: local writes pushed back to the backend."),
    ("kvgate_store_dirty_dropped", "dirty_dropped_total",
     "Local writes dropped from the resync backlog (over its bound) during outages."),
    ("kvgate_store_data_lost", "data_lost_total",
     "Times the store's backend was found to have lost its data (FLUSHALL, a restart "
     "without persistence): bindings made before were forgotten."),
)  # fmt: skip
"""The store's counters: exported name, ``StoreHealth`` field, help."""


def _store_readings(h: StoreHealth) -> list[tuple[str, str, str, float]]:
    """The store's own counters (a Redis outage is answered locally, so no request fails
    and ``kvgate_store_errors_total`` alone would not show it)."""
    degraded = ("gauge", "kvgate_store_degraded",
                "1 while the store's backend is unreachable and calls are answered locally.",
                1.0 if h.degraded else 0.0)  # fmt: skip
    return [degraded, *(("counter", n, text, getattr(h, f)) for n, f, text in _STORE_COUNTERS)]


@dataclass(frozen=True, slots=True)
class ToolCallReading:
    """The tool-call plane's state for ``/metrics`` (``ToolCallPlane.reading``)."""

    away: int
    tool_calls: int
    bookings: int
    returns: int
    horizon_s: float


_TOOL_CALLS = (
    ("gauge", "kvgate_tool_call_sessions_away", "away",
     "Sessions away on a tool call now: their KV kept (reserved) on their worker."),
    ("counter", "kvgate_tool_calls_total", "tool_calls",
     "Answers that ended in a tool call (finish_reason tool_calls, stop_reason tool_use)."),
    ("counter", "kvgate_tool_call_bookings_total", "bookings",
     "Sessions booked away on a tool call (answers with a session key ending in one)."),
    ("counter", "kvgate_tool_call_returns_total", "returns",
     "Sessions back from a tool call (their next request arrived while booked)."),
    ("gauge", "kvgate_tool_call_horizon_seconds", "horizon_s",
     "How long an away session's KV is kept: the learned quantile of tool-call pauses "
     "(core.toolcalls.ToolPauses; its prior until enough pauses were seen)."),
)  # fmt: skip
"""The tool-call plane's families: kind, name, ``ToolCallReading`` field, help."""


def _tool_call_readings(r: ToolCallReading) -> list[tuple[str, str, str, float]]:
    return [(kind, name, text, float(getattr(r, f))) for kind, name, f, text in _TOOL_CALLS]


_SPEED_GAUGES: tuple[tuple[str, str, Callable[[SpeedReport], float | None]], ...] = (
    ("kvgate_worker_learned_overhead_seconds", "Learned fixed time to first token (core.speed).",
     lambda r: r.speed.overhead_s),
    ("kvgate_worker_learned_prefill_seconds_per_token",
     "Learned prefill time per uncached prompt token.", lambda r: r.speed.prefill_s),
    ("kvgate_worker_learned_decode_seconds",
     "Learned time to first token each request decoding there adds.", lambda r: r.speed.decode_s),
    ("kvgate_worker_learned_queue_seconds",
     "Learned time to first token each request waiting ahead adds, past its prefill.",
     lambda r: r.speed.queue_s),
    ("kvgate_worker_ttft_prediction_error_ratio",
     "Median |predicted - observed| / observed TTFT of the worker's last 256 requests, as "
     "predicted when each was sent.", lambda r: r.ttft_error),
    ("kvgate_worker_speed_observations", "TTFTs the worker's speed was fitted to.",
     lambda r: r.observations),
)  # fmt: skip
"""Each worker's learned speed (``Policy.speeds``): name, help, value of its report."""


class SlotMetrics:
    """llama.cpp slot offload, restore and migration (``GatewayMetrics.slots``).

    A *save* writes an idle session's slot to disk before another session takes
    the slot (an offload); a *restore* loads it back when the session returns; a
    *migration* saves it on one worker and restores it on another. ``tier`` says
    where each turn's KV came from (slot, disk, migrated, shared, recompute, fallback).
    """

    def __init__(self, r: CollectorRegistry) -> None:
        counter, gauge = partial(Counter, registry=r), partial(Gauge, registry=r)
        histogram = partial(Histogram, registry=r)
        self.saves = counter(
            "kvgate_slot_saves_total",
            "Slots saved to disk (offloads), by worker and result (ok, error).",
            ["worker", "result"],
        )
        self.restores = counter(
            "kvgate_slot_restores_total",
            "Saved slots restored into a worker's slot, by worker and result (ok, error).",
            ["worker", "result"],
        )
        self.migrations = counter(
            "kvgate_slot_migrations_total",
            "Sessions moved between workers with their KV (save there, restore here).",
            ["from_worker", "to_worker", "result"],
        )
        self.fallbacks = counter(
            "kvgate_slot_recompute_fallbacks_total",
            "Turns recomputed because a restore, a seed or a migration failed, by worker and step.",
            ["worker", "step"],
        )
        self.turns = counter(
            "kvgate_slot_turns_total",
            "Turns sent to llama.cpp workers, by where their KV came from (tier).",
            ["worker", "tier"],
        )
        self.saved_bytes = gauge(
            "kvgate_slot_saved_bytes",
            "Bytes of saved slots the gateway keeps on disk.",
        )
        self.saved_sessions = gauge(
            "kvgate_slot_saved_sessions",
            "Sessions whose KV is saved on disk.",
        )
        buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
        self.save_seconds = histogram(
            "kvgate_slot_save_seconds",
            "Seconds to save a slot, as the gateway waited for it.",
            buckets=buckets,
        )
        self.restore_seconds = histogram(
            "kvgate_slot_restore_seconds",
            "Seconds to restore a slot, as the gateway waited for it.",
            buckets=buckets,
        )


class RolloutMetrics:
    """Per-version traffic and rollout metrics (``GatewayMetrics.rollout``).

    Request rate and error rate per version: ``kvgate_version_attempts_total``
    (every attempt on a worker of the version, ``outcome`` ok or error, as the
    canary gates count them); latency and TTFT histograms per version are
    ``kvgate_request_duration_seconds`` and ``kvgate_time_to_first_token_seconds``.
    """

    def __init__(self, r: CollectorRegistry) -> None:
        counter, gauge = partial(Counter, registry=r), partial(Gauge, registry=r)
        self.attempts = counter(
            "kvgate_version_attempts_total",
            "Attempts on workers of each model version, by outcome (ok, error).",
            ["model", "version", "outcome"],
        )
        self.weight = gauge(
            "kvgate_version_weight_percent",
            "Share of new traffic each model version receives, in percent.",
            ["model", "version"],
        )
        self.state = gauge(
            "kvgate_rollout_state",
            "1 for the state each rollout is in (pending, progressing, paused, ...), else 0.",
            ["rollout", "state"],
        )
        self.step = gauge(
            "kvgate_rollout_step",
            "The step each rollout is at, counting from 1.",
            ["rollout"],
        )
        self.canary_weight = gauge(
            "kvgate_rollout_canary_weight_percent",
            "The canary's weight in each rollout, in percent.",
            ["rollout"],
        )
        self.gate_value = gauge(
            "kvgate_rollout_gate_value",
            "Each gate's value at the last evaluation (ratios for *_vs_baseline gates).",
            ["rollout", "gate"],
        )
        self.evaluations = counter(
            "kvgate_rollout_evaluations_total",
            "Rollout evaluations, by result (waiting, advanced, inconclusive, rolled_back, ...).",
            ["rollout", "result"],
        )
        self.rollbacks = counter(
            "kvgate_rollout_rollbacks_total",
            "Rollouts rolled back automatically, by the gate that failed.",
            ["rollout", "gate"],
        )
        self.alerts = counter(
            "kvgate_rollout_alerts_total",
            "Rollout alerts raised, by reason, and whether the webhook took them.",
            ["rollout", "reason", "delivery"],
        )
        self.quality_scores = counter(
            "kvgate_quality_samples_total",
            "Sampled responses sent to the quality evaluator, by result (scored, dropped, failed).",
            ["model", "version", "result"],
        )
        self.leader = gauge(
            "kvgate_rollout_controller_leader",
            "1 while this replica holds the rollout controller lease.",
        )


class EppMetrics:
    """The endpoint picker's decisions (``kvgate epp``, ``dataplane.extproc``); in the
    gateway's registry only when a picker is what serves, so ``kvgate serve``'s page
    does not carry them."""

    OUTCOMES = ("picked", "shed", "no_endpoint", "draining", "bad_request", "error")
    """``outcome``: an endpoint picked, or the immediate response the picker gave instead
    (429 shed, 503 none ready or none of the subset, 503 draining, 4xx, other)."""

    def __init__(self, r: CollectorRegistry) -> None:
        counter, gauge = partial(Counter, registry=r), partial(Gauge, registry=r)
        histogram = partial(Histogram, registry=r)
        self.decisions = counter(
            "kvgate_epp_decisions_total",
            "Requests the endpoint picker decided, by outcome (picked, shed, no_endpoint, "
            "draining, bad_request, error).",
            ["outcome"],
        )
        for outcome in self.OUTCOMES:
            self.decisions.labels(outcome)
        self.decision_seconds = histogram(
            "kvgate_epp_decision_seconds",
            "Time from the ext_proc message that completed a request (its headers, or its "
            "body's end) to the picker's answer: routing and any admission queue wait.",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
        )
        self.streams = gauge(
            "kvgate_epp_streams_open",
            "ext_proc streams open now (one per request Envoy is processing).",
        )
