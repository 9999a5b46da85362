"""``GET /metrics``: the engine's state in vLLM's and NVIDIA DCGM exporter's names.

A custom collector reads ``engine.stats(now)`` at scrape time into a per-app
``CollectorRegistry`` (never the global one: several workers share a test
process). Series are labelled as the real exporters label them: vLLM's with
``model_name`` and ``engine``, DCGM's with ``gpu``, ``UUID``, ``device``,
``modelName`` and ``Hostname``. Counters are declared without ``_total``;
exposition appends it, giving e.g. ``vllm:prefix_cache_queries_total`` as vLLM does.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kvgate.engine.config import EngineConfig
from kvgate.engine.stats import EngineStats, HistogramSnapshot
from kvgate.workersim.driver import EngineDriver
from kvgate.workersim.faults import FaultInjector
from kvgate.workersim.options import WorkerOptions

_VLLM_LABELS = ("model_name", "engine")
_DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")


class WorkerCollector(Collector):
    """Reads the engine's stats at scrape time and yields vLLM and DCGM series."""

    def __init__(
        self,
        options: WorkerOptions,
        driver: EngineDriver,
        faults: FaultInjector,
        config: EngineConfig,
        finished: Counter[str],
        *,
        gpu_uuid: str,
    ) -> None:
        self._options = options
        self._driver = driver
        self._faults = faults
        self._config = config
        # Finished requests by reason (stop, length, abort): the HTTP layer knows why.
        self._finished = finished
        self._vllm = (options.model, "0")
        self._dcgm = (
            str(options.gpu_index),
            gpu_uuid,
            f"00000000:{options.gpu_index + 0x18:02X}:00.0",
            f"nvidia{options.gpu_index}",
            options.gpu_name,
            options.hostname,
        )

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: registering must not read stats outside the event loop."""
        return []

    def collect(self) -> Iterable[Metric]:
        """Every series, from one ``engine.stats`` snapshot."""
        stats = self._driver.engine.stats(self._driver.now())
        yield from self._vllm_series(stats)
        yield from self._dcgm_series(stats)
        yield from self._worker_series(stats)

    def _vllm_series(self, stats: EngineStats) -> Iterable[Metric]:
        labels = self._vllm
        yield _gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            _VLLM_LABELS,
            labels,
            stats.running,
        )
        yield _gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            _VLLM_LABELS,
            labels,
            stats.waiting,
        )
        yield _gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            _VLLM_LABELS,
            labels,
            stats.kv_usage,
        )
        yield _counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            _VLLM_LABELS,
            labels,
            stats.prefix_cache_queries,
        )
        yield _counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            _VLLM_LABELS,
            labels,
            stats.prefix_cache_hits,
        )
        yield _counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            _VLLM_LABELS,
            labels,
            stats.preemptions,
        )
        yield _counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            _VLLM_LABELS,
            labels,
            stats.prompt_tokens_total,
        )
        yield _counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            _VLLM_LABELS,
            labels,
            stats.generation_tokens_total,
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=(*_VLLM_LABELS, "finished_reason"),
        )
        for reason in ("stop", "length", "abort"):
            success.add_metric((*labels, reason), self._finished[reason])
        yield success
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=("block_size", "num_gpu_blocks", "num_cpu_blocks", "enable_prefix_caching"),
        )
        config = self._config
        info.add_metric(
            (
                str(config.block_size),
                str(config.num_gpu_blocks),
                str(config.cpu_offload_blocks),
                str(config.enable_prefix_caching),
            ),
            1.0,
        )
        yield info
        yield _histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            stats.ttft,
        )
        yield _histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            stats.e2e,
        )

    def _dcgm_series(self, stats: EngineStats) -> Iterable[Metric]:
        labels = self._dcgm
        used = float(stats.gpu_mem_used_mib)
        total = float(stats.gpu_mem_total_mib)
        yield _gauge(
            "DCGM_FI_DEV_GPU_TEMP",
            "GPU temperature (in C).",
            _DCGM_LABELS,
            labels,
            stats.gpu_temp_c,
        )
        yield _gauge(
            "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", _DCGM_LABELS, labels, used
        )
        yield _gauge(
            "DCGM_FI_DEV_FB_FREE",
            "Framebuffer memory free (in MiB).",
            _DCGM_LABELS,
            labels,
            max(total - used, 0.0),
        )

    def _worker_series(self, stats: EngineStats) -> Iterable[Metric]:
        faults = CounterMetricFamily(
            "kvgate_workersim_faults_injected",
            "Faults the emulated worker injected, by kind.",
            labels=("fault",),
        )
        for kind in ("error", "hang", "close_mid_stream", "refuse_connection", "extra_latency"):
            faults.add_metric((kind,), self._faults.injected[kind])
        yield faults
        yield CounterMetricFamily(
            "kvgate_workersim_aborted_requests",
            "Requests aborted in the engine because their client went away.",
            value=stats.requests_aborted,
        )
        tiers = GaugeMetricFamily(
            "kvgate_workersim_offload_blocks_used",
            "KV blocks held in each offload tier.",
            labels=("tier",),
        )
        tiers.add_metric(("cpu",), stats.cpu_offload_blocks_used)
        tiers.add_metric(("disk",), stats.disk_offload_blocks_used)
        yield tiers
        yield CounterMetricFamily(
            "kvgate_workersim_offloaded_blocks",
            "KV blocks moved from the GPU to an offload tier.",
            value=stats.offloaded_blocks,
        )
        yield CounterMetricFamily(
            "kvgate_workersim_restored_blocks",
            "KV blocks brought back to the GPU from an offload tier.",
            value=stats.restored_blocks,
        )
        # A benchmark on a crowded machine reads these to know whether its
        # model-clock latencies were inflated by the process waiting for a CPU.
        yield CounterMetricFamily(
            "kvgate_workersim_timeline_jumps",
            "Times the model timeline jumped forward because the process fell behind.",
            value=self._driver.lag_jumps,
        )
        yield CounterMetricFamily(
            "kvgate_workersim_timeline_lost_model_seconds",
            "Model seconds those jumps skipped (the engine computed nothing meanwhile).",
            value=self._driver.lag_lost_s,
        )


def build_registry(collector: WorkerCollector) -> CollectorRegistry:
    """A registry of its own holding only ``collector``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def _gauge(
    name: str, doc: str, names: Sequence[str], values: Sequence[str], value: float
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=names)
    family.add_metric(values, float(value))
    return family


def _counter(
    name: str, doc: str, names: Sequence[str], values: Sequence[str], value: float
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=names)
    family.add_metric(values, float(value))
    return family


def _histogram(
    name: str, doc: str, labels: Sequence[str], hist: HistogramSnapshot
) -> HistogramMetricFamily:
    """A histogram family from the engine's snapshot (vLLM's bucket bounds)."""
    family = HistogramMetricFamily(name, doc, labels=_VLLM_LABELS)
    buckets = [(_le(bound), float(total)) for bound, total in hist.cumulative()]
    family.add_metric(labels, buckets, float(hist.sum))
    return family


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))
