"""Reports of an experiment: ``results.json``, the console table and CSV.

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
from kvgate.tables import (
    DONE,
    LATENCIES,
    Column,
    causes_table,
    count_column,
    csv_text,
    ms_column,
    percent_column,
    ratio_column,
    rich_table,
)


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


SIM_COLUMNS: tuple[Column, ...] = (
    DONE,
    ratio_column("req/s", "throughput"),
    percent_column("hit", "hit_rate", narrow=True),
    percent_column("/bound", "hit_rate_of_bound", narrow=True),
    percent_column("/ref", "hit_rate_of_reference", narrow=True),
    *LATENCIES,
    ms_column("p99 floor", "ttft_floor_p99"),
    ms_column("queue", "queue_mean"),
    ratio_column("max/mean", "load_max_over_mean", narrow=True),
    ratio_column("CV", "load_cv"),
    count_column("shed", "shed", narrow=True),
    count_column("migr", "migrations"),
    count_column("preempt", "preemptions"),
)
"""``kvgate sim``'s columns; the narrow ones fit 80 columns, ``--wide`` shows all."""


def _sim_speed(s: Mapping[str, Any]) -> str:
    seconds = float(s.get("wall_s") or 0.0)
    return f"{s['requests'] / seconds * 60:,.0f}" if seconds > 0 else "-"


_SPEED = Column("sim/min", "requests_per_cpu_minute", _sim_speed, lambda s: s.get("wall_s"))


def _rows(point: PointResult, wall: Mapping[str, float] | None) -> list[tuple[str, Any]]:
    rows = []
    for run in point.runs:
        summary = dict(run.summary)
        if wall is not None:
            summary["wall_s"] = wall.get(run.policy, 0.0)
        rows.append((run.policy, summary))
    return rows


def results_table(
    point: PointResult, wall: Mapping[str, float] | None = None, *, wide: bool = False
) -> Table:
    """One table comparing the policies of one point (wall seconds per run optional).

    The default columns fit 80; ``wide`` adds the rest (p90, e2e p50, queue, CV,
    migrations, preemptions, and the simulator's speed when ``wall`` is given).
    """
    name = point.workload.get("name", "workload")
    title = f"{name}: infinite-cache bound hit rate {point.bound.hit_rate:.1%}"
    if point.reference is not None:
        title += f", fleet-KV LRU reference {point.reference.hit_rate:.1%}"
    if point.value is not None:
        title += f"  (sweep value {point.value})"
    columns = (*SIM_COLUMNS, _SPEED) if wall is not None else SIM_COLUMNS
    caption = None if wide else "max/mean: load spread (1.00 is even). --wide: every column."
    return rich_table(title, columns, _rows(point, wall), wide=wide, caption=caption)


def misses_table(point: PointResult) -> Table | None:
    """Where each policy's misses went, in points of its prompt tokens (``None``: not followed)."""
    rows = [(run.policy, run.summary) for run in point.runs if "misses" in run.summary]
    return causes_table(rows, f"  (sweep value {point.value})" if point.value is not None else "")


def results_csv(points: Sequence[PointResult]) -> str:
    """Every point's policies, every column as a raw number (times in seconds)."""
    rows = [
        (name, {**summary, "sweep_value": point.value})
        for point in points
        for name, summary in _rows(point, None)
    ]
    if points and points[0].value is not None:
        return csv_text(SIM_COLUMNS, rows, extra=[("sweep_value", lambda _n, s: s["sweep_value"])])
    return csv_text(SIM_COLUMNS, rows)


def print_tables(
    console: Console,
    points: Sequence[PointResult],
    wall: Sequence[Mapping[str, float]] | None,
    *,
    wide: bool = False,
) -> None:
    """One table per sweep point, and where the misses went when they were followed."""
    for i, point in enumerate(points):
        console.print(results_table(point, wall[i] if wall is not None else None, wide=wide))
        misses = misses_table(point)
        if misses is not None:
            console.print(misses)
    peers = [run.policy for run in points[0].runs if run.summary.get("as_peer")] if points else []
    if peers:
        console.print(
            f"run as peer routers run them (no pressure handling, no KV gate): {', '.join(peers)}"
        )
