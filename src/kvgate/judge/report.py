"""The judgments as tables: one row per scenario and mode, then one per bar.

The same cells feed the terminal (rich) and ``docs/benchmarks.md`` (Markdown), so
the page says exactly what the command printed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

SUMMARY_COLUMNS = (
    "shape",
    "mode",
    "seeds",
    "hit: kvgate / best peer, Δ pt",
    "TTFT p50 / best peer",
    "TTFT p99 / best peer",
    "/ round robin p50, p99",
    "verdict",
)
BAR_COLUMNS = ("shape", "mode", "bar", "against", "estimate (95% CI)", "verdict")


UNBOUNDED = "∞"
"""How an unbounded figure reads: a percentile that fell on requests never answered."""


def _number(value: float, spec: str) -> str:
    return UNBOUNDED if math.isinf(value) else f"{value:{spec}}"


def _interval(e: Mapping[str, Any] | None, *, unit: str = "x", digits: int = 2) -> str:
    if e is None:
        return "-"
    spec = f"+.{digits}f" if unit == " pt" else f".{digits}f"
    value = _number(e["value"], spec)
    if e.get("low") is None:
        return f"{value}{unit} (n={e['n']})"
    return f"{value}{unit} [{_number(e['low'], spec)}, {_number(e['high'], spec)}]"


def _secs(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return f"{UNBOUNDED} (unanswered)"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _hit(c: Mapping[str, Any]) -> str:
    own, peer = c.get("own_mean"), c.get("peer_mean")
    if own is None or peer is None:
        return "-"
    points = c.get("points")
    return f"{own:.1%} / {peer:.1%} ({c['best_peer']}), {_interval(points, unit=' pt')}"


def _latency(c: Mapping[str, Any]) -> str:
    if c.get("peer_mean") is None:
        return "-"
    return (
        f"{_secs(c['own_mean'])} / {_secs(c['peer_mean'])} ({c['best_peer']}): "
        f"{_interval(c.get('ratio'))}"
    )


def summary_cells(j: Mapping[str, Any]) -> list[str]:
    """One scenario's row of the summary table."""
    c = j["comparisons"]
    base = [_interval(c[m].get("baseline_ratio")) for m in ("ttft_p50", "ttft_p99") if m in c]
    mode = j["mode"]
    if j.get("lost_model_share"):
        mode += f" (lost {j['lost_model_share']:.0%})"
    if j.get("failed"):
        mode += f" ({j['failed']} failed)"
    refused = {n: c for n, c in (j.get("refused") or {}).items() if c}
    if refused:
        mode += (
            f" (refused of {j['requests']}: "
            + ", ".join(f"{n} {c}" for n, c in refused.items())
            + ")"
        )
    if j.get("answered_only"):
        mode += f" ({j['answered_only']} runs judged on the answered only)"
    return [
        j["scenario"],
        mode,
        str(len(j["seeds"])),
        _hit(c["hit_rate"]),
        _latency(c["ttft_p50"]),
        _latency(c["ttft_p99"]),
        ", ".join(base) if base else "-",
        j["verdict"],
    ]


def bar_rows(judgments: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """Every bar of every scenario: what it says, the estimate and its verdict."""
    rows = []
    for j in judgments:
        for bar in j["bars"]:
            unit = " pt" if bar["metric"] == "hit_rate" else "x"
            rows.append(
                [
                    j["scenario"],
                    j["mode"],
                    bar["bar"],
                    bar["against"] or "-",
                    _interval(bar["estimate"], unit=unit),
                    bar["verdict"],
                ]
            )
    return rows


def tables(judgments: Sequence[Mapping[str, Any]], title: str) -> list[Table]:
    """The summary and the bars as rich tables."""
    summary = Table(title=title, title_justify="left")
    for column in SUMMARY_COLUMNS:
        summary.add_column(column, justify="left" if column in ("shape", "mode") else "right")
    for j in judgments:
        summary.add_row(*summary_cells(j))
    bars = Table(title="bars (95% intervals over seeds, paired by seed)", title_justify="left")
    for column in BAR_COLUMNS:
        bars.add_column(column, justify="right" if column.startswith("estimate") else "left")
    for row in bar_rows(judgments):
        bars.add_row(*row)
    return [summary, bars]


def _markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def markdown(judgments: Sequence[Mapping[str, Any]]) -> str:
    """The summary and the bars as Markdown tables."""
    lines = _markdown_table(SUMMARY_COLUMNS, [summary_cells(j) for j in judgments])
    lines += ["", *_markdown_table(BAR_COLUMNS, bar_rows(judgments))]
    return "\n".join(lines) + "\n"


SECTION_TITLE = "Against the peers: the judge (issue 46)"


def _fleet(s: Mapping[str, Any]) -> str:
    profiles = s["profiles"]
    counts = {p: sum(1 for i in range(s["workers"]) if profiles[i % len(profiles)] == p)
              for p in profiles}  # fmt: skip
    fleet = " + ".join(f"{n} x {p}" for p, n in counts.items())
    kv = f"{s['kv_blocks']:,} KV blocks" if s["kv_blocks"] else "the GPU's KV"
    slow = s.get("slowdown")
    slowed = (
        f"; worker {slow['worker']} at {slow['speed']:g}x speed from {slow['at_s']:g} s, its "
        f"share judged from {slow['at_s'] + slow['settle_s']:g} s"
        if slow
        else ""
    )
    return f"{fleet}, {kv}, {s['concurrency']} in flight{slowed}"


def section(documents: Sequence[Mapping[str, Any]], commands: Sequence[str]) -> str:
    """The judge's section of ``docs/benchmarks.md`` from saved ``benchmarks/judge.py`` JSON
    documents (simulated, then live): how it judges, the scenarios, the tables."""
    judgments = [j for d in documents for j in d["judgments"]]
    scenarios: dict[str, Any] = {}
    for d in documents:
        scenarios.update(d["scenarios"])
    plans = [d.get("plan", {}) for d in documents]
    own = next((p["own"] for p in plans if p.get("own")), "default")
    parts = []
    for p in plans:
        for key, what in (("sim_seeds", "simulator"), ("live_seeds", "live")):
            if p.get(key):
                at = f" at {p['commit']}" if p.get("commit") else ""
                parts.append(f"{what} seeds {_span(p[key])}{at}")
    seeds = "; ".join(parts) or "no runs"
    lines = [
        f"## {SECTION_TITLE}",
        "",
        "```",
        *commands,
        "```",
        "",
        "One fixed protocol (`kvgate.judge`) decides whether `default` is as good as the peers. "
        "Per shape, `default`, the peers and round robin run on the same seeds: in the "
        "simulator the peers are `cache_aware` (sglang-router's and smg's rule, run as they "
        "run it: no pressure handling, no KV gate) and `round_robin` stands for HAProxy; live "
        "they are sglang-router 0.3.2 and smg in front of emulated workers, beside kvgate's "
        "round robin. For each metric the **best peer** is the one with the best mean; the "
        "table gives `default`'s value over it as the geometric mean of the per-seed ratios "
        "with a 95% t interval (hit rate: the mean difference in points), paired by seed. "
        "Each shape has bars from issue 46 (below); a bar is *met* where its whole interval "
        "is on the good side, a **LOSS** only where its whole interval is past the bar, and "
        "*open* where the interval holds it. A shape is a LOSS where any bar is. Hit rates and "
        "TTFTs count every request sent, so that refusing work cannot pass for speed: a "
        "request a router refused (429) or failed is a miss (all its prompt tokens uncached) "
        f"and a TTFT that never came, {UNBOUNDED}, sorted last: a p99 over a run with more "
        f"than 1% unanswered is {UNBOUNDED}. An unbounded figure is compared as such, never "
        "averaged: a seed where only `default`'s is unbounded makes that bar a LOSS (the "
        f"ratio {UNBOUNDED}), one where only the peer's is makes it met (the peer's "
        f"{UNBOUNDED} is its value), a seed where both are is left out, and seeds of both "
        "kinds leave the bar open. A request longer than every worker's context (a 400 from "
        "the engine) is the workload's and is held against no router. The mode column "
        "counts the requests each router refused (429) or failed, the workload's too, over "
        "the judged router's requests, and live, the most model time a worker lost to the "
        "busy machine (*lost*: where it is large, TTFT measured the machine as much as the "
        "router). "
        f"The judged policy: `{own}`; the runs: {seeds}.",
        "",
        *(_markdown_table(SUMMARY_COLUMNS, [summary_cells(j) for j in judgments])),
        "",
        *(_markdown_table(BAR_COLUMNS, bar_rows(judgments))),
        "",
        "The shapes (`kvgate.judge.scenarios`; every registered workload is judged, a new one on "
        "4 H100s with 2,000 KV blocks and the default bars: hit within half a point, TTFT p50 "
        "and p99 within 5% of the best peer; the *held-out* shapes, which the default policy "
        "was never tuned on, run in the simulator only):",
        "",
        "| shape | workload | requests | fleet | why |",
        "|---|---|--:|---|---|",
    ]
    for name, s in scenarios.items():
        why = f"*held out:* {s['why']}" if s.get("sim_only") else s["why"]
        lines.append(f"| {name} | `{s['workload']}` | {s['requests']} | {_fleet(s)} | {why} |")
    lines.append("")
    return "\n".join(lines)


def _span(seeds: Sequence[int]) -> str:
    items = sorted(seeds)
    if items == list(range(items[0], items[-1] + 1)) and len(items) > 2:
        return f"{items[0]}-{items[-1]}"
    return ", ".join(str(s) for s in items)
