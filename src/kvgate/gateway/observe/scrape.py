"""Reading a worker's ``/metrics`` text into one engine-neutral ``WorkerSignals``.

Each engine exposes the same few facts under its own names (vLLM ``vllm:*``,
SGLang ``sglang:*``, llama.cpp ``llamacpp:*``) and the NVIDIA DCGM exporter adds
the GPU's (``DCGM_FI_DEV_*``). This module maps them onto one record. Parsing is
pure (text in, record out); fetching the text is the prober's job.

Rules that hold for every field:

- ``None`` means unknown: the metric was absent, NaN, infinite, negative, or a
  DCGM "blank" sentinel. Never zero, because a zero would look like an idle worker.
- Counts (running, waiting, counters) are summed across label sets: vLLM splits
  them by ``engine`` (data-parallel ranks) and ``model_name``.
- Fractions (KV usage) take the worst label set, since one full data-parallel
  rank preempts as surely as a full worker.
- Several GPUs (label ``gpu``): the worst one is reported (highest temperature,
  highest memory usage), because a tensor-parallel group fails with its
  fullest or hottest GPU. Memory used/total come from the same (fullest) GPU so
  that ``used / total == gpu_mem_usage`` holds.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias

from prometheus_client.parser import text_string_to_metric_families

Engine: TypeAlias = Literal["vllm", "sglang", "llamacpp", "unknown"]

# DCGM reports "no value" with large integers: DCGM_INT32_BLANK is 0x7ffffff0 and the
# blanks above it (not found, not supported, ...) count up from there; the INT64
# blanks (0x7ffffffffffffff0 and up), the FP64 blank (2**47) and NVML's
# 0xffffffff "not available" are all larger. No real temperature, MiB or percent
# comes near this, so everything from it up is treated as a missing reading.
DCGM_BLANK_FLOOR = float(0x7FFFFFF0)


class ScrapeError(ValueError):
    """The scraped body is not Prometheus text exposition format."""


@dataclass(frozen=True, slots=True)
class WorkerSignals:
    """What one scrape says about a worker, engine-neutral; ``None`` means unknown.

    ``kv_usage``, ``gpu_mem_usage`` and ``gpu_util`` are fractions in 0..1.
    Counters (``*_total``) are cumulative since the engine started; prefix-cache
    counters count tokens. ``prefix_cache_hit_rate`` is the engine's own gauge
    (SGLang) or, failing that, hits / queries since start.
    """

    engine: Engine = "unknown"
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    kv_capacity_tokens: int | None = None
    preemptions_total: int | None = None
    prefix_cache_queries_total: int | None = None
    prefix_cache_hits_total: int | None = None
    prefix_cache_hit_rate: float | None = None
    gpu_count: int = 0
    gpu_temp_c: float | None = None
    gpu_mem_temp_c: float | None = None
    gpu_util: float | None = None
    gpu_mem_used_mib: float | None = None
    gpu_mem_total_mib: float | None = None
    gpu_mem_usage: float | None = None
    slots: int | None = None
    """The engine's batch slots (llama.cpp: ``GET /slots``, not a metric: the prober adds it)."""
    prefill_s_per_token: float | None = None
    """The engine's own prefill seconds per uncached token since it started (llama.cpp)."""
    generated_total: int | None = None
    """Tokens the engine generated since it started: rising, it is making progress."""
    scraped_at: float | None = None

    @property
    def memory_usage(self) -> float | None:
        """The higher of KV usage and GPU memory usage: the pressure signal."""
        known = [v for v in (self.kv_usage, self.gpu_mem_usage) if v is not None]
        return max(known) if known else None

    @property
    def has_gpu(self) -> bool:
        """True when any GPU (DCGM) reading was present."""
        return self.gpu_count > 0


@dataclass(frozen=True, slots=True)
class _Dialect:
    """One engine's metric names; each field lists alternatives, preferred first."""

    engine: Engine
    prefix: str
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()
    queries: tuple[str, ...] = ()
    hits: tuple[str, ...] = ()
    hit_rate: tuple[str, ...] = ()
    prefill_seconds: tuple[str, ...] = ()  # over ``queries`` (tokens it evaluated)
    generated: tuple[str, ...] = ()
    # llama.cpp's prompt-token counter counts only tokens it evaluated, so the
    # tokens looked up in the cache are evaluated + cached.
    queries_exclude_hits: bool = False


# Counters appear with ``_total`` in the text format; the bare names are what
# older exporters or hand-written endpoints emit.
_DIALECTS: tuple[_Dialect, ...] = (
    _Dialect(
        engine="vllm",
        prefix="vllm:",
        running=("vllm:num_requests_running",),
        waiting=("vllm:num_requests_waiting",),
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        preemptions=("vllm:num_preemptions_total", "vllm:num_preemptions"),
        queries=("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"),
        hits=("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
        generated=("vllm:generation_tokens_total", "vllm:generation_tokens"),
    ),
    _Dialect(
        engine="sglang",
        prefix="sglang:",
        running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        kv_usage=("sglang:token_usage",),
        hit_rate=("sglang:cache_hit_rate",),
        generated=("sglang:generation_tokens_total",),
    ),
    _Dialect(
        engine="llamacpp",
        prefix="llamacpp:",
        running=("llamacpp:requests_processing",),
        waiting=("llamacpp:requests_deferred",),
        kv_usage=("llamacpp:kv_cache_usage_ratio",),
        queries=("llamacpp:prompt_tokens_total",),
        hits=("llamacpp:prompt_tokens_cached_total",),
        prefill_seconds=("llamacpp:prompt_seconds_total",),
        generated=("llamacpp:tokens_predicted_total",),
        queries_exclude_hits=True,
    ),
)

_GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
_GPU_MEM_TEMP = "DCGM_FI_DEV_MEMORY_TEMP"
_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
_FB_USED = "DCGM_FI_DEV_FB_USED"
_FB_FREE = "DCGM_FI_DEV_FB_FREE"
_DCGM_NAMES = (_GPU_TEMP, _GPU_MEM_TEMP, _GPU_UTIL, _FB_USED, _FB_FREE)

_Samples: TypeAlias = Mapping[str, list[tuple[dict[str, str], float]]]


def parse_worker_metrics(text: str, *, now: float | None = None) -> WorkerSignals:
    """Map one ``/metrics`` body (any supported engine, and/or DCGM) to ``WorkerSignals``.

    ``now`` is stamped into ``scraped_at`` so staleness can be judged later.
    Raises ``ScrapeError`` when the body is not Prometheus text format.
    """
    samples = _collect(_relevant(text))
    return replace(merge(_engine_signals(samples), _gpu_signals(samples)), scraped_at=now)


def merge(engine_signals: WorkerSignals, dcgm_signals: WorkerSignals) -> WorkerSignals:
    """Combine an engine scrape with a DCGM exporter scrape of the same worker.

    GPU fields come from ``dcgm_signals`` where known (it is the authority on the
    GPU), engine fields from ``engine_signals``; each falls back to the other.
    ``scraped_at`` is the older of the two, so staleness is judged conservatively.
    """
    changes: dict[str, float | int | None] = {}
    for name in _GPU_FIELDS:
        changes[name] = _known(getattr(dcgm_signals, name), getattr(engine_signals, name))
    for name in _ENGINE_FIELDS:
        changes[name] = _known(getattr(engine_signals, name), getattr(dcgm_signals, name))
    stamps = [t for t in (engine_signals.scraped_at, dcgm_signals.scraped_at) if t is not None]
    engine = engine_signals.engine if engine_signals.engine != "unknown" else dcgm_signals.engine
    return replace(
        engine_signals,
        engine=engine,
        gpu_count=max(engine_signals.gpu_count, dcgm_signals.gpu_count),
        scraped_at=min(stamps) if stamps else None,
        **changes,  # type: ignore[arg-type]
    )


def _known(preferred: float | None, fallback: float | None) -> float | None:
    return preferred if preferred is not None else fallback


_GPU_FIELDS = (
    "gpu_temp_c",
    "gpu_mem_temp_c",
    "gpu_util",
    "gpu_mem_used_mib",
    "gpu_mem_total_mib",
    "gpu_mem_usage",
)
_ENGINE_FIELDS = (
    "running",
    "waiting",
    "kv_usage",
    "kv_capacity_tokens",
    "preemptions_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "prefix_cache_hit_rate",
    "slots",
    "prefill_s_per_token",
    "generated_total",
)


_PREFIXES = ("vllm:", "sglang:", "llamacpp:", "DCGM_FI_")
"""Every name read here starts with one of these."""


def _relevant(text: str) -> str:
    """Only the lines of families read here: the parser is slow, and a page may be huge
    with other exporters' series (a big page cost seconds of event loop per scrape)."""
    keep = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[2].startswith(_PREFIXES):
                keep.append(line)
        elif line.startswith(_PREFIXES):
            keep.append(line)
    if not keep:
        # Nothing of ours: the parser still judges whether it is the format at all,
        # on a bounded head of the page.
        return "\n".join(text.splitlines()[:64]) + "\n"
    keep.append("")
    return "\n".join(keep)


def _collect(text: str) -> _Samples:
    """Every sample by its exposed name, with NaN/inf dropped; raises ``ScrapeError``."""
    out: defaultdict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = float(sample.value)
                if math.isfinite(value):
                    out[sample.name].append((dict(sample.labels), value))
                else:
                    # Remember the name so the engine is still recognised.
                    out.setdefault(sample.name, [])
    except (ValueError, IndexError, TypeError, KeyError) as exc:
        head = text[:80].replace("\n", "\\n")
        raise ScrapeError(f"not Prometheus text format ({exc}); body starts {head!r}") from exc
    return out


def _first(samples: _Samples, names: Iterable[str]) -> list[float] | None:
    """Values of the first name present; ``None`` if none is (or all were NaN)."""
    for name in names:
        if name in samples:
            values = [v for _, v in samples[name] if v >= 0]
            return values or None
    return None


def _sum_int(samples: _Samples, names: Iterable[str]) -> int | None:
    values = _first(samples, names)
    return round(sum(values)) if values is not None else None


def _max_fraction(samples: _Samples, names: Iterable[str]) -> float | None:
    values = _first(samples, names)
    return min(1.0, max(values)) if values is not None else None


def _mean_fraction(samples: _Samples, names: Iterable[str]) -> float | None:
    values = _first(samples, names)
    return min(1.0, sum(values) / len(values)) if values is not None else None


def _detect(samples: _Samples) -> _Dialect | None:
    for dialect in _DIALECTS:
        if any(name.startswith(dialect.prefix) for name in samples):
            return dialect
    return None


def _engine_signals(samples: _Samples) -> WorkerSignals:
    dialect = _detect(samples)
    if dialect is None:
        return WorkerSignals()
    hits = _sum_int(samples, dialect.hits)
    queries = _sum_int(samples, dialect.queries)
    values = _first(samples, dialect.prefill_seconds)
    seconds = sum(values) if values is not None else None
    prefill = seconds / queries if seconds and queries else None
    if dialect.queries_exclude_hits:
        # Without the cached counter the processed count alone says nothing
        # about the cache, so both stay unknown.
        queries = queries + hits if queries is not None and hits is not None else None
    hit_rate = _mean_fraction(samples, dialect.hit_rate)
    if hit_rate is None and queries and hits is not None:
        hit_rate = min(1.0, hits / queries)
    return WorkerSignals(
        engine=dialect.engine,
        running=_sum_int(samples, dialect.running),
        waiting=_sum_int(samples, dialect.waiting),
        kv_usage=_max_fraction(samples, dialect.kv_usage),
        kv_capacity_tokens=_kv_capacity(samples),
        preemptions_total=_sum_int(samples, dialect.preemptions),
        prefix_cache_queries_total=queries,
        prefix_cache_hits_total=hits,
        prefix_cache_hit_rate=hit_rate,
        prefill_s_per_token=prefill,
        generated_total=_sum_int(samples, dialect.generated),
    )


def _kv_capacity(samples: _Samples) -> int | None:
    """KV cache size in tokens from vLLM's ``cache_config_info`` labels (blocks × block size)."""
    for labels, _ in samples.get("vllm:cache_config_info", []):
        try:
            tokens = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            continue
        if tokens > 0:
            return tokens
    return None


def _gpu_key(labels: Mapping[str, str]) -> str:
    return labels.get("gpu") or labels.get("UUID") or labels.get("device") or ""


def _gpu_signals(samples: _Samples) -> WorkerSignals:
    per_gpu: defaultdict[str, dict[str, float | None]] = defaultdict(dict)
    for name in _DCGM_NAMES:
        for labels, value in samples.get(name, []):
            reading = value if 0 <= value < DCGM_BLANK_FLOOR else None
            slot = per_gpu[_gpu_key(labels)]
            # A GPU listed twice (e.g. once per pod label) keeps a real reading.
            if slot.get(name) is None:
                slot[name] = reading
    if not per_gpu:
        return WorkerSignals()

    def worst(name: str) -> float | None:
        known = [g[name] for g in per_gpu.values() if g.get(name) is not None]
        return max(v for v in known if v is not None) if known else None

    fullest: tuple[float, float, float] | None = None  # (usage, used, total)
    for gpu in per_gpu.values():
        used, free = gpu.get(_FB_USED), gpu.get(_FB_FREE)
        if used is None or free is None or used + free <= 0:
            continue
        candidate = (used / (used + free), used, used + free)
        if fullest is None or candidate > fullest:
            fullest = candidate
    util = worst(_GPU_UTIL)
    return WorkerSignals(
        gpu_count=len(per_gpu),
        gpu_temp_c=worst(_GPU_TEMP),
        gpu_mem_temp_c=worst(_GPU_MEM_TEMP),
        gpu_util=min(1.0, util / 100.0) if util is not None else None,
        gpu_mem_used_mib=fullest[1] if fullest else worst(_FB_USED),
        gpu_mem_total_mib=fullest[2] if fullest else None,
        gpu_mem_usage=fullest[0] if fullest else None,
    )
