"""Ablations in the simulator: a policy with each term off, on every shape, over seeds.

A *variant* is a policy and its options (``default`` with one term switched off, or a
peer's model); a *shape* is a workload and the fleet it runs on. Every variant runs every
shape on every seed in this one process (virtual time: the figures do not depend on the
machine's load), and ``summarize`` gives, per shape and variant, the mean of hit rate and
TTFT p50/p99 over the seeds with a 95% interval, and the same for the ratio of each
variant's figure to a baseline variant's on the same seed (paired: the seeds' own
variation cancels). ``benchmarks/ablation.py`` prints the table and keeps the JSON.

Two line-ups, both on the judge's scenarios as the judge runs its policy there
(``judge_shapes``; ``SHAPES``: five older shapes): ``ttft``'s terms (``VARIANTS``), and
``default``'s (``DEFAULT_VARIANTS``: each term off by a neutral value of its weight,
or by ``DefaultConfig.off`` where it has none). ``verdict`` says where a term earns its
place: switching it off is significantly worse (an interval excludes parity on the bad
side).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, get_args

from kvgate.core.policies.default import Term
from kvgate.judge.scenarios import Scenario, judged
from kvgate.judge.simulated import sim_config
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
    Variant("-delay", "ttft", {"delay_cap": 0.0}),  # the prefill later requests wait behind
    Variant("decode_2ms", "ttft", {"decode_s": 0.002}),  # the old decode prior
    Variant("default", "default"),
)


DEFAULT_VARIANTS: tuple[Variant, ...] = (
    Variant("default", "default"),
    Variant("-stay", "default", {"stay": 0.0}),  # a warm cache's pull
    Variant("-evict", "default", {"evict": 0.0}),  # what new blocks evict, by fill
    Variant("-decode", "default", {"decode_s": 0.0}),  # requests on a worker delay its TTFT
    Variant("-warming", "default", {"warm_min_blocks": 0}),  # shared prefixes copied ahead
    Variant("-restorable", "default", {"restorable_credit": 0.0}),  # KV restorable from disk
    *(Variant(f"-{term}", "default", {"off": frozenset({term})}) for term in get_args(Term)),
)
"""``default`` and each of its terms off (``DefaultConfig``; ``off`` where no weight has a
neutral value): openings' life (sessions, headerless chains), a later turn's reach to its
earlier turn's end and its home, judged claims, running blocks, the engine's waiting
queue, soft-pressured workers holding the prompt."""


CHAT_TIGHT = Shape(
    "chat-tight",
    "chat:rate=8,think_s=1,turns_mean=6,user_tokens=300,output_tokens=10",
    300,
    {"kv_blocks": (1000,), "block_size": 16, "scrape_interval": 2.0},
)
"""Explicit sessions on KV that holds a few conversations a worker (``tests/sim/
test_agreement.py``'s shape): where a new session opens decides its hits. No judge
scenario has explicit sessions on a tight cache; ``default``'s line-up adds it."""


def judge_shapes(scenarios: Sequence[Scenario] | None = None) -> tuple[Shape, ...]:
    """The judge's scenarios (``kvgate.judge.scenarios``) as shapes, on the fleet the judge
    runs ``default`` on (``sim_config``); by default not the held-out ones (``sim_only``):
    a shape a term is tuned on is no longer held out."""
    shapes = []
    tuned = [s for s in judged() if not s.sim_only]
    for scenario in tuned if scenarios is None else scenarios:
        config = sim_config(scenario, 0, as_peer=False)
        fleet = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        del fleet["seed"], fleet["max_requests"]
        shapes.append(Shape(scenario.name, scenario.workload, scenario.requests, fleet))
    return tuple(shapes)


def run_one(shape: Shape, variant: Variant, seed: int) -> dict[str, float]:
    """One run: the variant on the shape at ``seed``; its hit rate and TTFT p50/p99."""
    config = dataclasses.replace(SimConfig(), seed=seed, **dict(shape.fleet))
    requests = build_workload(shape.workload, seed=seed).requests()
    config = dataclasses.replace(config, max_requests=shape.requests)
    run = Simulation(config, requests, variant.policy, dict(variant.options)).run()
    return {m: float(run.summary[m]) for m in (*METRICS, "shed")}


def run_all(
    shapes: Sequence[Shape],
    variants: Sequence[Variant],
    seeds: Sequence[int],
    progress: Callable[[str], None] | None = None,
    *,
    jobs: int = 1,
) -> list[dict[str, Any]]:
    """Every variant on every shape and seed: one row each (``jobs`` runs at once)."""
    plan = [(shape, variant, seed) for shape in shapes for seed in seeds for variant in variants]
    rows = []
    with contextlib.ExitStack() as stack:
        done: Iterable[dict[str, float]] = map(run_one, *zip(*plan, strict=True))
        if jobs > 1:
            pool = stack.enter_context(ProcessPoolExecutor(jobs))
            done = pool.map(run_one, *zip(*plan, strict=True))
        for (shape, variant, seed), figures in zip(plan, done, strict=True):
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


def verdict(entry: Mapping[str, Any]) -> str:
    """``worse`` where an interval against the baseline lies wholly on the bad side of
    parity (hit rate down, a TTFT up), ``better`` where one lies on the good side and none
    on the bad, else ``-`` (the baseline's own rows and missing pairs too)."""
    bad = good = False
    for m in METRICS:
        vs = entry.get(f"{m}_vs")
        if vs is None:
            continue
        low, high = vs[0] - vs[1], vs[0] + vs[1]
        if m == "hit_rate":  # points, parity 0
            bad, good = bad or high < 0.0, good or low > 0.0
        else:  # ratios, parity 1
            bad, good = bad or low > 1.0, good or high < 1.0
    return "worse" if bad else "better" if good else "-"
