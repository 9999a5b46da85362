"""Precise against approximate routing on caches under eviction, over seeds (issue 47).

``benchmarks/kv_events_bench.py --eviction 1-8`` prints it. Each shape runs in the
simulator with ``default`` on the approximate index and ``default+kv_events`` on the
engines' KV events (``sim.kvfeed``), seed by seed on the same requests:

- ``shared-prefix-groups``: SGLang's 16 groups of 8 prompts behind 2,048-token
  system prompts, 4 workers of 154 blocks (64 tokens): KV at about 1.2x the
  working set;
- ``chat`` (explicit sessions) and ``headerless-chat`` (none), 1,500 requests each,
  4 workers of ``kv_blocks`` blocks: conversations on small caches;
- ``conversation-trace``: the judge's Mooncake-shaped trace (``shared-opening-trace``:
  conversations behind one shared 512-token block, no session ids), 1,500 requests on
  4 workers of 2,500 blocks (the judge's 10,000 of 16 tokens): the fleet's KV holds
  about two fifths of what could hit.

A ``Scenario`` adds what the approximate index cannot see by construction (issue 47):
``replicas`` gateway replicas with the clients split between them (``sim.replicas``),
sharing the store or each alone (``shared_store``), and ``restarts`` worker restarts
spread over the run (each clears that worker's cache; the workers in turn). The
engine's own eviction is in every shape. The reference and the replays know neither
replicas nor restarts: a restart's lost cache counts against both policies alike.

Per shape: each policy's hit rate as a share of the capacity-aware reference (one
LRU cache the size of the fleet's KV, ``workload.bound``) with its 95% interval,
and the paired figures the bar asks for (``judge.stats``): hit rate, events less
approximate, in points; TTFT p99 and p50, events over approximate.

``losses=True`` (``--losses``) adds where each policy's hits were lost
(``workload.losses``): its placements replayed on a pinned pool per worker, each
prompt token put down to a cause, in points of the prompt tokens, beside the
reference's own (its ``evicted_here``: what one pool of the fleet's KV evicts);
the same placements with a second copy of a block free (``free copies``); and
the share of the fleet's KV that second copies took.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from kvgate.judge.stats import Estimate, mean_interval, paired_points, paired_ratio
from kvgate.sim.experiment import Experiment, fleet_kv_blocks
from kvgate.sim.simulation import SimConfig
from kvgate.workload.losses import CAUSES, losses
from kvgate.workload.pinned import Span, pinned_reference, split_replay
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import SimRequest
from kvgate.workload.synthetic import build_workload

APPROXIMATE, PRECISE = "default", "default+kv_events"

SHAPES: dict[str, tuple[str, int | None, int | None]] = {
    "shared-prefix-groups": (
        "shared-prefix-groups:groups=16,prompts=8,system_tokens=2048",
        154,
        None,
    ),
    "chat": ("chat", None, 1500),
    "headerless-chat": ("headerless-chat", None, 1500),
    "conversation-trace": ("shared-opening-trace", 2500, 1500),
}
"""Shape -> (workload, KV blocks a worker (None: the run's ``kv_blocks``), requests)."""


@dataclass(frozen=True)
class Scenario:
    """What the approximate index cannot see (module docs); the default: nothing."""

    replicas: int = 1
    shared_store: bool = True
    split: str = "client"
    restarts: int = 0

    def label(self) -> str:
        """The scenario in a heading ('' for the default)."""
        parts = []
        if self.replicas > 1:
            store = "one store" if self.shared_store else "a store each"
            parts.append(f"{self.replicas} replicas, {store}, split by {self.split}")
        if self.restarts:
            parts.append(f"{self.restarts} worker restarts")
        return "; ".join(parts)

    def config(self, config: SimConfig, requests: list[SimRequest]) -> SimConfig:
        """``config`` with the scenario's replicas and restarts (times from ``requests``)."""
        last = max((r.arrival for r in requests), default=1.0)
        restarts = tuple(
            (last * (j + 1) / (self.restarts + 1), j % config.workers) for j in range(self.restarts)
        )
        return replace(
            config,
            replicas=self.replicas,
            shared_store=self.shared_store,
            replica_split=self.split,
            worker_restarts=restarts,
        )


def run_shape(
    shape: str,
    seed: int,
    kv_blocks: int,
    policies: Sequence[str],
    lost: bool = False,
    *,
    scenario: Scenario = Scenario(),
) -> dict[str, dict[str, Any]]:
    """One seed of one shape: each policy's summary (``hit_rate_of_reference`` included;
    with ``lost``, its ``lost`` causes and the reference's, module docs)."""
    spec, blocks, requests = SHAPES[shape]
    config = SimConfig(
        workers=4, kv_blocks=(blocks or kv_blocks,), seed=seed, max_requests=requests
    )
    config = scenario.config(config, list(config.limited(build_workload(spec, seed).requests())))
    experiment = Experiment(lambda _: build_workload(spec, seed=seed), policies, config)
    (point,) = experiment.run()
    assert point.reference is not None
    reference = point.reference.hit_rate
    codec = PromptCodec(config.block_size, config.features, model=config.model)
    pools = [config.engine_config(i).num_gpu_blocks for i in range(config.workers)]
    out: dict[str, dict[str, Any]] = {}
    for run in point.runs:
        summary = out[run.policy] = dict(run.summary)
        served = list(config.limited(build_workload(spec, seed=seed).requests()))
        replays = {
            "pinned": pinned_reference(served, codec, fleet_kv_blocks(config), run.spans),
            "split": split_replay(served, codec, pools, run.spans, "run"),
            "greedy": split_replay(served, codec, pools, run.spans, "greedy"),
            "partition": split_replay(served, codec, pools, run.spans, "partition"),
        }
        for name, bound in replays.items():
            summary[f"{name}_hit_rate"] = bound.hit_rate
            summary[f"{name}_of_reference"] = bound.hit_rate / reference if reference else None
        pinned = replays["pinned"].hit_rate
        summary["hit_rate_of_pinned"] = summary["hit_rate"] / pinned if pinned else None
        if lost:
            summary["lost"] = _lost(served, codec, pools, run.spans, reference)
    return out


def _lost(
    served: list[SimRequest],
    codec: PromptCodec,
    pools: list[int],
    spans: dict[str, Span],
    reference: float,
) -> dict[str, float]:
    """A run's placements replayed (``workload.losses``): points of its prompt tokens by
    cause, the reference's, and what free copies and the copies' share come to."""
    own = losses(served, codec, pools, spans, "run")
    free = losses(served, codec, pools, spans, "run", free_copies=True)
    ref = losses(served, codec, pools, None, "reference")
    out = {cause: points for cause, points in own.points().items()}
    out |= {f"reference {cause}": points for cause, points in ref.points().items()}
    out["free copies of reference"] = free.hit_rate / reference if reference else 0.0
    out["copies"] = 100.0 * own.copies
    return out


def _column(rows: list[dict[str, dict[str, Any]]]) -> Any:
    """``of(policy, key)``: that figure of each seed's run, in seed order."""
    return lambda policy, key: [float(row[policy][key]) for row in rows]


def _figure(e: Estimate, digits: int = 1) -> dict[str, float | None]:
    return {k: v if v is None else round(v, digits + 2) for k, v in e.to_json().items()}


def compare(
    seeds: Sequence[int],
    *,
    kv_blocks: int = 150,
    shapes: Sequence[str] = tuple(SHAPES),
    peers: Sequence[str] = (),
    jobs: int = 1,
    lost: bool = False,
    scenario: Scenario = Scenario(),
) -> dict[str, dict[str, Any]]:
    """Every shape over ``seeds`` (``jobs`` processes): the figures of the module docs."""
    policies = (APPROXIMATE, PRECISE, *peers)
    work = [(shape, seed) for shape in shapes for seed in seeds]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [
            pool.submit(run_shape, s, seed, kv_blocks, policies, lost, scenario=scenario)
            for s, seed in work
        ]
        runs = [f.result() for f in futures]
    results: dict[str, dict[str, Any]] = {}
    for shape in shapes:
        by_seed = [r for (s, _), r in zip(work, runs, strict=True) if s == shape]
        of = _column(by_seed)
        row: dict[str, Any] = {"seeds": list(seeds), "scenario": scenario.label()}
        for policy in policies:
            row[f"{policy} of reference %"] = _figure(
                mean_interval([100.0 * x for x in of(policy, "hit_rate_of_reference")])
            )
            row[f"{policy} of pinned reference %"] = _figure(
                mean_interval([100.0 * x for x in of(policy, "hit_rate_of_pinned")])
            )
            for name in ("pinned", "split", "greedy", "partition"):
                row[f"{policy}'s timing: {name} replay of reference %"] = _figure(
                    mean_interval([100.0 * x for x in of(policy, f"{name}_of_reference")])
                )
            row[f"{policy} ttft_p99 s"] = _figure(mean_interval(of(policy, "ttft_p99")), 2)
            if lost:
                row |= _lost_rows(by_seed, policy)
        row["hit, events - approximate, pt"] = _figure(
            paired_points(of(PRECISE, "hit_rate"), of(APPROXIMATE, "hit_rate")), 2
        )
        for key in ("ttft_p99", "ttft_p50"):
            row[f"{key}, events / approximate"] = _figure(
                paired_ratio(of(PRECISE, key), of(APPROXIMATE, key)), 2
            )
        results[shape] = row
    return results


def _lost_rows(by_seed: list[dict[str, dict[str, Any]]], policy: str) -> dict[str, Any]:
    """``_lost``'s figures over the seeds: each cause's points, the policy's less the
    reference's (what the gap to it is made of), and the free copies' replay."""
    lost = [row[policy]["lost"] for row in by_seed]
    rows: dict[str, Any] = {}
    for cause in CAUSES:
        rows[f"{policy} lost, pt: {cause}"] = _figure(mean_interval([x[cause] for x in lost]), 2)
        rows[f"{policy} lost, pt: {cause} less the reference's"] = _figure(
            mean_interval([x[cause] - x[f"reference {cause}"] for x in lost]), 2
        )
    free = [100.0 * x["free copies of reference"] for x in lost]
    rows[f"{policy}'s placement, free copies, of reference %"] = _figure(mean_interval(free))
    rows[f"{policy} copies, % of KV"] = _figure(mean_interval([x["copies"] for x in lost]))
    return rows


def lines(results: dict[str, dict[str, Any]]) -> list[str]:
    """The comparison as text, one shape a block."""

    def shown(e: dict[str, float | None]) -> str:
        low, high = e["low"], e["high"]
        return f"{e['value']}" if low is None else f"{e['value']} [{low}, {high}]"

    out: list[str] = []
    for shape, row in results.items():
        seeds, label = row["seeds"], row.get("scenario")
        scenario = f"; {label}" if label else ""
        out.append(f"{shape} (seeds {seeds[0]}-{seeds[-1]}, n={len(seeds)}{scenario})")
        out += [
            f"  {key}: {shown(value)}"
            for key, value in row.items()
            if key not in ("seeds", "scenario")
        ]
    return out
