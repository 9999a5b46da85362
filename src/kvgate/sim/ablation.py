"""Ablations in the simulator: a policy with each term off, on every shape, over seeds.

A *variant* is a policy and its options (``default`` with one term switched off, or a
peer's model); a *shape* is a workload and the fleet it runs on. Every variant runs every
shape on every seed in this one process (virtual time: the figures do not depend on the
machine's load), and ``summarize`` gives, per shape and variant, the mean of hit rate and
TTFT p50/p99 over the seeds with a 95% interval, and the same for the ratio of each
variant's figure to a baseline variant's on the same seed (paired: the seeds' own
variation cancels). ``benchmarks/ablation.py`` prints the table and keeps the JSON.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.sim.simulation import SimConfig, Simulation
from kvgate.workload.synthetic import build_workload

METRICS = ("hit_rate", "ttft_p50", "ttft_p99")


@dataclass(frozen=True)
class Shape:
    """A workload (``build_workload``'s spec) and its fleet (``SimConfig`` fields)."""

    name: str
    workload: str
    requests: int
    fleet: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Variant:
    """A policy and its options, by a name for the table."""

    name: str
    policy: str
    options: Mapping[str, Any] = field(default_factory=dict)


SHAPES: tuple[Shape, ...] = (
    # No reuse at high concurrency on a fleet of two GPU kinds: speed is all that matters.
    Shape(
        "mixed-noreuse",
        "rag:documents=200000,zipf_s=0.01,system_tokens=0,rate=40",
        600,
        {"profiles": ("h100-llama3-8b", "a100-llama3-8b"), "client_concurrency": 48},
    ),
    # SGLang's generated-shared-prefix groups, each worker's KV a quarter of the prompts.
    Shape("groups-tight", "shared-prefix-groups", 128, {"kv_blocks": (1000,), "block_size": 16}),
    # Conversations with no session id: the turns' own chains tie them together.
    Shape("chat-hdrless", "headerless-chat", 600, {"kv_blocks": (2000,), "block_size": 16}),
    Shape("agent-preamble", "agent-preamble", 240, {"kv_blocks": (2000,), "block_size": 16}),
    # Sessions with X-Session-ID on long documents.
    Shape("session-docs", "session-docs", 600, {"kv_blocks": (3000,), "block_size": 16}),
)

VARIANTS: tuple[Variant, ...] = (
    Variant("ttft", "ttft"),
    Variant("-learn", "ttft", {"learn": False}),
    Variant("+engine_queue", "ttft", {"engine_queue": True}),
    Variant("-evict", "ttft", {"evict": 0.0}),
    Variant("default", "default"),
    Variant("cache_aware", "cache_aware"),
    Variant("round_robin", "round_robin"),
)


def run_one(shape: Shape, variant: Variant, seed: int) -> dict[str, float]:
    """One run: the variant on the shape at ``seed``; its hit rate and TTFT p50/p99."""
    config = dataclasses.replace(SimConfig(), seed=seed, **dict(shape.fleet))
    requests = build_workload(shape.workload, seed=seed).requests()
    config = dataclasses.replace(config, max_requests=shape.requests)
    run = Simulation(config, requests, variant.policy, dict(variant.options)).run()
    return {m: float(run.summary[m]) for m in METRICS}


def run_all(
    shapes: Sequence[Shape],
    variants: Sequence[Variant],
    seeds: Sequence[int],
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Every variant on every shape and seed: one row each."""
    rows = []
    for shape in shapes:
        for seed in seeds:
            for variant in variants:
                figures = run_one(shape, variant, seed)
                rows.append({"shape": shape.name, "variant": variant.name, "seed": seed, **figures})
                if progress is not None:
                    progress(f"{shape.name} s{seed} {variant.name}: {figures}")
    return rows


def interval(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval (Student's t; 0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    t = _T95.get(len(values) - 1, 2.0)
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
        10: 2.23, 11: 2.20, 12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}  # fmt: skip


def summarize(rows: Sequence[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Per shape and variant: each metric's mean ± 95% half-width, and its paired ratio to
    ``baseline``'s (hit rate: the difference in points) with its interval."""
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for row in rows:
        by.setdefault((row["shape"], row["variant"]), {})[row["seed"]] = row
    out = []
    for (shape, variant), seeds in by.items():
        base = by.get((shape, baseline), {})
        entry: dict[str, Any] = {"shape": shape, "variant": variant, "seeds": len(seeds)}
        for m in METRICS:
            entry[m] = interval([r[m] for r in seeds.values()])
            paired = [(r[m], base[s][m]) for s, r in seeds.items() if s in base]
            if not paired:
                continue
            if m == "hit_rate":
                entry[f"{m}_vs"] = interval([100 * (a - b) for a, b in paired])
            else:
                entry[f"{m}_vs"] = interval([a / b if b > 0 else 1.0 for a, b in paired])
        out.append(entry)
    return out
