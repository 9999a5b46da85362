"""Engine counters and histograms, and the ``EngineStats`` snapshot read by drivers.

Histogram bucket boundaries are vLLM's, so the emulated worker's ``/metrics`` can
expose them under vLLM's metric names unchanged.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""``vllm:time_to_first_token_seconds`` bucket upper bounds."""

E2E_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""``vllm:e2e_request_latency_seconds`` bucket upper bounds."""


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """A histogram at one instant: per-bucket counts (the last is ``+Inf``), sum and count."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, cumulative count)`` pairs as Prometheus exposes them, ending at ``+Inf``."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class Histogram:
    """A fixed-bucket histogram (a value equal to a bound falls in that bound's bucket)."""

    __slots__ = ("_counts", "bounds", "count", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Record one value."""
        self._counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> HistogramSnapshot:
        """An immutable copy of the current state."""
        return HistogramSnapshot(self.bounds, tuple(self._counts), self.sum, self.count)


class Counters:
    """The engine's cumulative counters, shared by the scheduler and the engine."""

    __slots__ = (
        "aborted",
        "e2e",
        "finished",
        "generation_tokens",
        "offloaded_blocks",
        "preemptions",
        "prefix_hits",
        "prefix_queries",
        "prompt_tokens",
        "restored_blocks",
        "steps",
        "ttft",
    )

    def __init__(self) -> None:
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preemptions = 0
        self.finished = 0
        self.aborted = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.offloaded_blocks = 0
        self.restored_blocks = 0
        self.steps = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One engine at one instant, in the terms vLLM and DCGM report.

    ``prefix_cache_queries`` and ``prefix_cache_hits`` are cumulative token counts
    (hits are GPU prefix-cache hits only; tokens restored from offload tiers are in
    ``restored_blocks``). ``kv_usage`` is the fraction of GPU blocks in use (0..1).
    ``gpu_utilisation`` (0..1, DCGM's ``GPU_UTIL``) is the busy level of the step
    running at the instant asked about, 0 when the engine is idle.
    """

    running: int
    waiting: int
    kv_usage: float
    num_gpu_blocks: int
    block_size: int
    gpu_blocks_in_use: int
    gpu_blocks_cached: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    preemptions: int
    requests_finished: int
    requests_aborted: int
    prompt_tokens_total: int
    generation_tokens_total: int
    ttft: HistogramSnapshot
    e2e: HistogramSnapshot
    offloaded_blocks: int
    restored_blocks: int
    evicted_blocks: int
    cpu_offload_blocks_used: int
    disk_offload_blocks_used: int
    gpu_temp_c: float
    gpu_mem_used_mib: float
    gpu_mem_total_mib: float
    gpu_utilisation: float
    steps: int

    @property
    def prefix_queries(self) -> int:
        """Alias of ``prefix_cache_queries`` (the name in docs/dev/contracts.md)."""
        return self.prefix_cache_queries

    @property
    def prefix_hits(self) -> int:
        """Alias of ``prefix_cache_hits``."""
        return self.prefix_cache_hits

    @property
    def prefix_hit_rate(self) -> float:
        """Hit tokens over queried tokens, 0 before any query."""
        return (
            self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        )
