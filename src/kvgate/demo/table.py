"""The demo's one result table: each policy's cache hits, latency and load spread."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _workers(fleet: Mapping[str, Any]) -> str:
    kind = fleet.get("kind", "emulated")
    return f"emulated {fleet['profile']}" if kind == "emulated" else str(kind)


def demo_table(results: Mapping[str, Any]) -> Table:
    """Policies as rows; latencies in model seconds, as the caption says."""
    fleet = results["config"]["fleet"]
    workload = results["workload"]
    title = (
        f"{fleet['workers']} {_workers(fleet)} workers, {workload['name']} workload: "
        f"infinite-cache bound hit rate {results['bound_hit_rate']:.1%}"
    )
    runs = results["policies"]
    # Emulated workers report their engine's own TTFT (kvgate_timing): what routing
    # changes, free of this one process's CPU contention times the time scale.
    engine_timed = bool(runs) and all("worker_ttft_p50" in s for s in runs.values())
    engine_note = (
        "Engine TTFT: the workers' own model-time record (queue + prefill). "
        if engine_timed
        else ""
    )
    caption = (
        f"Client TTFT: wall time x time scale {fleet['time_scale']:g}, including the "
        "gateway's, client's and workers' shared CPU. "
        f"{engine_note}Load = requests served per worker (max/mean; 1.00 is even)."
    )
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    columns: tuple[str, ...] = (
        "policy", "requests", "errors", "hit rate", "/bound",
        "client TTFT p50", "p99", "e2e p50", "load max/mean", "served",
    )  # fmt: skip
    if engine_timed:
        columns = (*columns[:7], "engine TTFT p50", "p99", *columns[7:])
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for policy, s in runs.items():
        of_bound = s.get("hit_rate_of_bound")
        served = "/".join(str(n) for n in s["served"].values())
        engine = (_ms(s["worker_ttft_p50"]), _ms(s["worker_ttft_p99"])) if engine_timed else ()
        table.add_row(
            policy,
            f"{s['finished']}/{s['requests']}",
            str(s["errors"] + s["shed"]),
            f"{s['hit_rate']:.1%}",
            f"{of_bound:.0%}" if of_bound is not None else "-",
            _ms(s["ttft_p50"]),
            _ms(s["ttft_p99"]),
            *engine,
            _ms(s["e2e_p50"]),
            f"{s['load_max_over_mean']:.2f}",
            served,
        )
    return table
