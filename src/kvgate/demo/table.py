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
    caption = (
        f"Latencies in model seconds: measured wall time x time scale {fleet['time_scale']:g}. "
        "Load = requests served per worker (max/mean; 1.00 is even)."
    )
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    columns = (
        "policy", "requests", "errors", "hit rate", "/bound",
        "TTFT p50", "TTFT p99", "e2e p50", "load max/mean", "served",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for policy, s in results["policies"].items():
        of_bound = s.get("hit_rate_of_bound")
        served = "/".join(str(n) for n in s["served"].values())
        table.add_row(
            policy,
            f"{s['finished']}/{s['requests']}",
            str(s["errors"] + s["shed"]),
            f"{s['hit_rate']:.1%}",
            f"{of_bound:.0%}" if of_bound is not None else "-",
            _ms(s["ttft_p50"]),
            _ms(s["ttft_p99"]),
            _ms(s["e2e_p50"]),
            f"{s['load_max_over_mean']:.2f}",
            served,
        )
    return table
