"""Reports of an experiment: ``results.json`` and the console table.

``results.json`` holds only simulated quantities, so the same inputs and seed
give the same bytes; wall-clock speed goes to the console only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from kvgate.sim.experiment import PointResult
from kvgate.sim.simulation import SimConfig


def config_json(config: SimConfig) -> dict[str, Any]:
    """The fleet and gateway settings, JSON-ready."""
    return {
        "workers": config.workers,
        "profiles": list(config.profiles),
        "kv_blocks": list(config.kv_blocks),
        "block_size": config.block_size,
        "max_num_seqs": config.max_num_seqs,
        "max_batched_tokens": config.max_batched_tokens,
        "scrape_interval": config.scrape_interval,
        "stale_after": config.stale_after,
        "affinity_ttl": config.affinity_ttl,
        "seed": config.seed,
        "max_requests": config.max_requests,
        "duration": config.duration,
        "admission": config.admission.model_dump(mode="json"),
        "features": config.features.model_dump(mode="json"),
    }


def _point_json(point: PointResult) -> dict[str, Any]:
    reference = point.reference
    return {
        "value": point.value,
        "workload": point.workload,
        "bound_hit_rate": round(point.bound.hit_rate, 6),
        "bound": asdict(point.bound) | {"hit_rate": round(point.bound.hit_rate, 6)},
        "reference_hit_rate": round(reference.hit_rate, 6) if reference is not None else None,
        "reference": (
            asdict(reference) | {"hit_rate": round(reference.hit_rate, 6)}
            if reference is not None
            else None
        ),
        "policies": {run.policy: {"options": run.options, **run.summary} for run in point.runs},
    }


def results_json(
    points: Sequence[PointResult],
    config: SimConfig,
    sweep_param: str | None = None,
    policy_options: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """The whole experiment: the first point at the top level, every point under ``sweep``."""
    first = _point_json(points[0])
    out: dict[str, Any] = {
        "workload": first["workload"],
        "config": config_json(config),
        "policy_options": dict(policy_options or {}),
        "bound_hit_rate": first["bound_hit_rate"],
        "bound": first["bound"],
        "reference_hit_rate": first["reference_hit_rate"],
        "reference": first["reference"],
        "policies": first["policies"],
    }
    if sweep_param is not None:
        out["sweep"] = {
            "param": sweep_param,
            "values": [p.value for p in points],
            "points": [_point_json(p) for p in points],
        }
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}ms" if seconds < 10 else f"{seconds:.1f}s"


def results_table(point: PointResult, wall: Mapping[str, float] | None = None) -> Table:
    """One rich table comparing the policies of one point (wall seconds per run optional)."""
    name = point.workload.get("name", "workload")
    title = f"{name}: infinite-cache bound hit rate {point.bound.hit_rate:.1%}"
    if point.reference is not None:
        title += f", fleet-KV LRU reference {point.reference.hit_rate:.1%}"
    if point.value is not None:
        title += f"  (sweep value {point.value})"
    table = Table(title=title, title_justify="left")
    for column in (
        "policy",
        "done",
        "req/s",
        "hit",
        "/bound",
        "/ref",
        "TTFT p50",
        "p90",
        "p99",
        "e2e p50",
        "p99",
        "queue",
        "max/mean",
        "CV",
        "shed",
        "migr",
        "preempt",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    if wall is not None:
        table.add_column("sim/min", justify="right")
    for run in point.runs:
        s = run.summary
        of_bound = s.get("hit_rate_of_bound")
        of_reference = s.get("hit_rate_of_reference")
        row = [
            run.policy,
            f"{s['finished']}/{s['requests']}",
            f"{s['throughput']:.2f}",
            f"{s['hit_rate']:.1%}",
            f"{of_bound:.1%}" if of_bound is not None else "-",
            f"{of_reference:.1%}" if of_reference is not None else "-",
            _ms(s["ttft_p50"]),
            _ms(s["ttft_p90"]),
            _ms(s["ttft_p99"]),
            _ms(s["e2e_p50"]),
            _ms(s["e2e_p99"]),
            _ms(s["queue_mean"]),
            f"{s['load_max_over_mean']:.2f}",
            f"{s['load_cv']:.2f}",
            str(s["shed"]),
            str(s["migrations"]),
            str(s["preemptions"]),
        ]
        if wall is not None:
            seconds = wall.get(run.policy, 0.0)
            row.append(f"{s['requests'] / seconds * 60:,.0f}" if seconds > 0 else "-")
        table.add_row(*row)
    return table


def print_tables(
    console: Console, points: Sequence[PointResult], wall: Sequence[Mapping[str, float]] | None
) -> None:
    """One table per sweep point."""
    for i, point in enumerate(points):
        console.print(results_table(point, wall[i] if wall is not None else None))
