"""The judgments as tables: one row per scenario and mode, then one per bar.

The same cells feed the terminal (rich) and ``docs/benchmarks.md`` (Markdown), so
the page says exactly what the command printed.
"""

from __future__ import annotations

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


def _interval(e: Mapping[str, Any] | None, *, unit: str = "x", digits: int = 2) -> str:
    if e is None:
        return "-"
    value = f"{e['value']:+.{digits}f}" if unit == " pt" else f"{e['value']:.{digits}f}"
    if e.get("low") is None:
        return f"{value}{unit} (n={e['n']})"
    if unit == " pt":
        return f"{value}{unit} [{e['low']:+.{digits}f}, {e['high']:+.{digits}f}]"
    return f"{value}{unit} [{e['low']:.{digits}f}, {e['high']:.{digits}f}]"


def _secs(value: float | None) -> str:
    if value is None:
        return "-"
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
    return [
        j["scenario"],
        j["mode"],
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
