"""The demo's one result table: each policy's cache hits, latency and load spread."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from kvgate.tables import Column, csv_text, field, ms, percent, rich_table


def _workers(fleet: Mapping[str, Any]) -> str:
    kind = fleet.get("kind", "emulated")
    return f"emulated {fleet['profile']}" if kind == "emulated" else str(kind)


def _served(s: Mapping[str, Any]) -> str:
    return "/".join(str(n) for n in s["served"].values())


DEMO_COLUMNS: tuple[Column, ...] = (
    Column("requests", "finished", lambda s: f"{s['finished']}/{s['requests']}", field("finished")),
    Column(
        "errors",
        "errors_and_sheds",
        lambda s: str(s["errors"] + s["shed"]),
        lambda s: s["errors"] + s["shed"],
        narrow=True,
    ),
    Column(
        "hit rate", "hit_rate", lambda s: percent(s["hit_rate"]), field("hit_rate"), narrow=True
    ),
    Column(
        "/bound",
        "hit_rate_of_bound",
        lambda s: percent(s.get("hit_rate_of_bound"), 0),
        field("hit_rate_of_bound"),
        narrow=True,
    ),
    Column("TTFT p50", "ttft_p50", lambda s: ms(s["ttft_p50"]), field("ttft_p50"), narrow=True),
    Column("p99", "ttft_p99", lambda s: ms(s["ttft_p99"]), field("ttft_p99"), narrow=True),
    Column("e2e p50", "e2e_p50", lambda s: ms(s["e2e_p50"]), field("e2e_p50")),
    Column(
        "load",
        "load_max_over_mean",
        lambda s: f"{s['load_max_over_mean']:.2f}",
        field("load_max_over_mean"),
        narrow=True,
    ),
    Column("served", "served", _served, _served),
)
"""The demo's columns; client TTFT (wall time x time scale) is ``TTFT``."""

_ENGINE: tuple[Column, ...] = (
    Column(
        "engine p50",
        "worker_ttft_p50",
        lambda s: ms(s.get("worker_ttft_p50")),
        field("worker_ttft_p50"),
        narrow=True,
    ),
    Column(
        "engine p99",
        "worker_ttft_p99",
        lambda s: ms(s.get("worker_ttft_p99")),
        field("worker_ttft_p99"),
    ),
)


def _columns(results: Mapping[str, Any]) -> tuple[Column, ...]:
    runs = results["policies"]
    # Emulated workers report their engine's own TTFT (kvgate_timing): what routing
    # changes, free of this one process's CPU contention times the time scale.
    if bool(runs) and all("worker_ttft_p50" in s for s in runs.values()):
        return (*DEMO_COLUMNS[:6], *_ENGINE, *DEMO_COLUMNS[6:])
    return DEMO_COLUMNS


def demo_table(results: Mapping[str, Any], *, wide: bool = False) -> Table:
    """Policies as rows; latencies in model seconds, as the caption says."""
    fleet = results["config"]["fleet"]
    workload = results["workload"]
    title = (
        f"{fleet['workers']} {_workers(fleet)} workers, {workload['name']} workload: "
        f"infinite-cache bound {results['bound_hit_rate']:.1%}"
    )
    columns = _columns(results)
    engine_note = (
        "engine p50: the workers' own model-time TTFT (queue + prefill). "
        if columns is not DEMO_COLUMNS
        else ""
    )
    caption = (
        f"TTFT: client wall time x time scale {fleet['time_scale']:g}, sharing the CPU "
        f"with gateway and workers. {engine_note}load: max/mean requests per worker "
        "(1.00 is even)."
    )
    if not wide:
        caption += " --wide: every column."
    return rich_table(title, columns, list(results["policies"].items()), wide=wide, caption=caption)


def demo_csv(results: Mapping[str, Any]) -> str:
    """Every column as a raw number (model seconds), one line per policy."""
    return csv_text(_columns(results), list(results["policies"].items()))
