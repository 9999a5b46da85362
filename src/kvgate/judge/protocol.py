"""The fixed protocol: per scenario, the judged router against the best peer, seed by seed.

Runs (simulated or live) are records of one router on one scenario and seed
(``record``). ``judge`` pairs the judged router's records with each peer's by
seed and, per metric (hit rate, TTFT p50, p99), takes the **best peer** (the best
mean over the seeds both ran), then the paired ratio with its 95% interval (and
the hit rate's difference in points), and checks the scenario's bars
(``scenarios.Criterion``): a scenario is a **loss** only where some bar's interval
lies wholly on its bad side (``stats``).

The figures count every request a router was sent, answered or not: one it refused
(429) or failed is a miss for the hit rate (all its prompt tokens uncached) and a TTFT
of +inf (it sorts last: a p99 over a run with more than 1% unanswered is unbounded,
and ``stats.paired_ratio`` makes that bar a LOSS against a peer that answered). A
request no worker of the fleet could serve (longer than every worker's context) is
the workload's, not held against any router. Runs saved before this rule (no
``unanswered`` in the record) were judged over the requests answered: ``answered_only``
counts them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.judge.scenarios import METRICS, Criterion, Scenario
from kvgate.judge.stats import (
    LOSS,
    MET,
    OPEN,
    Estimate,
    at_least,
    at_most,
    paired_points,
    paired_ratio,
    within,
)

COMPARED = ("hit_rate", "ttft_p50", "ttft_p99")
"""The metrics every scenario compares with the best peer."""

RETURNING = ("ttft_return_p50", "ttft_return_p99")
"""Compared too where a scenario sets a bar on them (the turns back from a tool call)."""

LOWER_IS_BETTER = frozenset({"ttft_p50", "ttft_p99", *RETURNING})


@dataclass(frozen=True)
class Routers:
    """Who runs: the judged router, the peers, the baseline (names as the mode knows them)."""

    own: str
    peers: tuple[str, ...]
    baseline: str
    own_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def all(self) -> tuple[str, ...]:
        """Every router, the judged one first."""
        return (self.own, *self.peers, self.baseline)

    def role(self, name: str) -> str:
        """``own``, ``peer`` or ``baseline``."""
        return "own" if name == self.own else "baseline" if name == self.baseline else "peer"


def record(
    scenario: Scenario, seed: int, router: str, role: str, *, mode: str, **figures: Any
) -> dict[str, Any]:
    """One run's record as the protocol reads it (the same keys live and simulated)."""
    return {
        "scenario": scenario.name,
        "mode": mode,
        "seed": seed,
        "router": router,
        "role": role,
        **figures,
    }


def _by_seed(runs: Iterable[Mapping[str, Any]], metric: str) -> dict[int, float]:
    return {
        int(r["seed"]): float(r[metric])
        for r in runs
        if r.get(metric) is not None and "error" not in r
    }


def _paired(own: Mapping[int, float], other: Mapping[int, float]) -> tuple[list[float], ...]:
    seeds = sorted(set(own) & set(other))
    return [own[s] for s in seeds], [other[s] for s in seeds]


def _ratio(own: Mapping[int, float], other: Mapping[int, float]) -> Estimate | None:
    a, b = _paired(own, other)
    try:
        return paired_ratio(a, b)
    except ValueError:
        return None


def _best_peer(
    metric: str, own: Mapping[int, float], peers: Mapping[str, Mapping[int, float]]
) -> str | None:
    """The peer with the best mean of ``metric`` over the seeds it shares with ``own``."""
    means = {}
    for name, values in peers.items():
        _, theirs = _paired(own, values)
        if theirs:
            means[name] = statistics.fmean(theirs)
    if not means:
        return None
    if metric in LOWER_IS_BETTER:
        return min(means, key=lambda n: (means[n], n))
    return max(means, key=lambda n: (means[n], n))


def _verdict(criterion: Criterion, e: Estimate) -> str:
    if criterion.metric == "hit_rate":
        return at_least(e, -criterion.bound)
    if criterion.metric == "slowed_share":
        return within(e, 1 - criterion.bound, 1 + criterion.bound)
    return at_most(e, criterion.bound)


def _estimate(
    criterion: Criterion,
    scenario: Scenario,
    own: Mapping[int, float],
    others: Mapping[str, Mapping[int, float]],
    name: str | None,
) -> tuple[str | None, Estimate | None]:
    """The estimate a criterion is judged on against router ``name``, and ``name``."""
    if criterion.against == "speed":
        expected = scenario.expected_share()
        if expected is None or not own:
            return None, None
        return "speed", paired_ratio(list(own.values()), [expected] * len(own))
    if name is None or name not in others:
        return name, None
    if criterion.metric == "hit_rate":
        a, b = _paired(own, others[name])
        return name, paired_points(a, b) if a else None
    return name, _ratio(own, others[name])


def judge_scenario(
    scenario: Scenario, mode: str, runs: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The scenario's judgment in ``mode`` from its runs (None when the judged router has none)."""
    mine = [r for r in runs if r["scenario"] == scenario.name and r["mode"] == mode]
    own_runs = [r for r in mine if r["role"] == "own"]
    if not own_runs:
        return None
    peer_names = sorted({r["router"] for r in mine if r["role"] == "peer"})
    baseline_names = sorted({r["router"] for r in mine if r["role"] == "baseline"})
    comparisons: dict[str, Any] = {}
    best_of: dict[str, str | None] = {}
    values: dict[str, dict[str, dict[int, float]]] = {}
    barred = {c.metric for c in scenario.criteria}
    for metric in (*COMPARED, *(m for m in RETURNING if m in barred), "slowed_share"):
        own = _by_seed(own_runs, metric)
        others = {
            n: _by_seed((r for r in mine if r["router"] == n), metric)
            for n in (*peer_names, *baseline_names)
        }
        values[metric] = {"": own, **others}
        if metric == "slowed_share":
            continue
        peers = {n: others[n] for n in peer_names}
        best = _best_peer(metric, own, peers)
        best_of[metric] = best
        entry: dict[str, Any] = {"best_peer": best, "own_mean": _mean(own.values())}
        if best is not None:
            entry["peer_mean"] = _mean(peers[best].values())
            ratio = _ratio(own, peers[best])
            entry["ratio"] = ratio.to_json() if ratio else None
            if metric == "hit_rate":
                a, b = _paired(own, peers[best])
                entry["points"] = paired_points(a, b).to_json() if a else None
        for base in baseline_names:
            ratio = _ratio(own, others[base])
            entry["baseline"] = base
            entry["baseline_mean"] = _mean(others[base].values())
            entry["baseline_ratio"] = ratio.to_json() if ratio else None
        comparisons[metric] = entry
    bars = []
    for criterion in scenario.criteria:
        own = values[criterion.metric][""]
        others = {k: v for k, v in values[criterion.metric].items() if k}
        target = best_of.get(criterion.metric)
        if criterion.against == "round_robin":
            target = baseline_names[0] if baseline_names else None
        against, e = _estimate(criterion, scenario, own, others, target)
        bars.append(
            {
                "bar": criterion.describe(),
                "metric": criterion.metric,
                "against": against,
                "estimate": e.to_json() if e else None,
                "verdict": _verdict(criterion, e) if e else OPEN,
            }
        )
    verdicts = [b["verdict"] for b in bars]
    overall = LOSS if LOSS in verdicts else MET if verdicts and set(verdicts) == {MET} else OPEN
    shares = values["slowed_share"]
    return {
        "scenario": scenario.name,
        "mode": mode,
        "seeds": sorted({int(r["seed"]) for r in own_runs}),
        "comparisons": comparisons,
        "expected_share": scenario.expected_share(),
        "slowed_share": {n or "own": _mean(v.values()) for n, v in shares.items() if v} or None,
        "bars": bars,
        "verdict": overall,
        # Live: the most model time any worker lost to a busy machine (it inflates TTFT).
        "lost_model_share": max((r.get("lost_model_share") or 0.0 for r in mine), default=0.0),
        "failed": sum(1 for r in mine if "error" in r),
        # Requests refused or failed, per router: a router that sheds answers fewer, faster.
        "refused": {
            n: sum((r.get("errors") or 0) + (r.get("shed") or 0) for r in mine if r["router"] == n)
            for n in sorted({r["router"] for r in mine})
        },
        "requests": sum(r.get("requests") or 0 for r in own_runs),
        # Runs saved before refusals counted, that refused some: judged on the answered only.
        "answered_only": sum(
            1
            for r in mine
            if "unanswered" not in r and "error" not in r and (r.get("errors") or r.get("shed"))
        ),
    }


def _mean(values: Iterable[float]) -> float | None:
    items = list(values)
    return round(statistics.fmean(items), 6) if items else None


def judge(scenarios: Sequence[Scenario], runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every scenario's judgment in every mode its runs hold (simulated first, then live)."""
    modes = sorted({r["mode"] for r in runs}, key=lambda m: (m != "sim", m))
    out = []
    for mode in modes:
        for scenario in scenarios:
            judged = judge_scenario(scenario, mode, runs)
            if judged is not None:
                out.append(judged)
    return out


def merge_runs(*groups: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Saved runs from several files as one: a later run of the same scenario, mode, seed
    and router replaces an earlier one (rerun one shape, keep the others)."""
    merged: dict[tuple[str, str, int, str], dict[str, Any]] = {}
    for group in groups:
        for run in group:
            key = (run["scenario"], run["mode"], int(run["seed"]), run["router"])
            merged.pop(key, None)
            merged[key] = dict(run)
    return list(merged.values())


def parse_seeds(text: str) -> list[int]:
    """``"500-507"`` or ``"1,2,5-6"`` -> the seeds, in order; an empty list is a ``ValueError``."""
    seeds: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, sep, last = part.partition("-")
        seeds += list(range(int(first), int(last) + 1)) if sep else [int(first)]
    if not seeds:
        raise ValueError("no seeds")
    return seeds


def document(
    scenarios: Sequence[Scenario],
    runs: Sequence[Mapping[str, Any]],
    judgments: Sequence[Mapping[str, Any]],
    **plan: Any,
) -> dict[str, Any]:
    """The JSON the command writes: the plan, each scenario's settings, every run, the verdicts."""
    return {
        "plan": plan,
        "scenarios": {
            s.name: {
                "workload": s.workload,
                "requests": s.requests,
                "workers": s.workers,
                "profiles": list(s.profiles),
                "kv_blocks": s.kv_blocks,
                "block_size": s.block_size,
                "concurrency": s.concurrency,
                "slowdown": None if s.slowdown is None else vars(s.slowdown),
                "bars": [c.describe() for c in s.criteria],
                "why": s.why,
                "sim_only": s.sim_only,
            }
            for s in scenarios
        },
        "runs": list(runs),
        "judgments": list(judgments),
    }


__all__ = [
    "COMPARED",
    "LOSS",
    "MET",
    "METRICS",
    "OPEN",
    "Routers",
    "document",
    "judge",
    "merge_runs",
    "parse_seeds",
    "record",
]
