"""Result tables shared by ``kvgate sim``, ``bench`` and ``demo``: for people and for programs.

A table is a list of ``Column``s over rows of run summaries (one per policy or
label). People get a rich table that fits an 80-column terminal: only the
columns marked ``narrow`` unless ``--wide`` asks for all of them. Programs get
``--format json`` (the whole results document, as ``results.json`` holds it) or
``--format csv`` (every column, raw numbers, one line per row) on stdout, with
progress and messages sent to stderr so stdout stays clean.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from kvgate.workload.misses import CAUSES

NARROW_WIDTH = 80
"""The terminal width the default columns must fit."""

_WIDE_WIDTH = 220
"""Width of the table console when stdout is not a terminal and ``--wide`` is given."""

Summary = Mapping[str, Any]


class OutputFormat(StrEnum):
    """What a results command prints on stdout."""

    TABLE = "table"
    JSON = "json"
    CSV = "csv"


WideOption = Annotated[
    bool, typer.Option("--wide", help="Show every column (the default fits 80 columns)")
]
FormatOption = Annotated[
    OutputFormat,
    typer.Option("--format", help="table for people; json or csv on stdout for programs"),
]


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its header, its CSV name, how to show and how to export a summary's value.

    ``narrow`` columns are the default view; the others appear with ``--wide``
    and always in CSV.
    """

    header: str
    key: str
    show: Callable[[Summary], str]
    value: Callable[[Summary], object]
    narrow: bool = False


def rich_table(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[tuple[str, Summary]],
    *,
    wide: bool,
    label: str = "policy",
    caption: str | None = None,
) -> Table:
    """A rich table of ``rows`` (label, summary): narrow columns only unless ``wide``."""
    table = Table(
        title=title,
        caption=caption,
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        pad_edge=False,
    )
    shown = [c for c in columns if wide or c.narrow]
    table.add_column(label, justify="left", no_wrap=True)
    for column in shown:
        table.add_column(column.header, justify="right", no_wrap=True)
    for name, summary in rows:
        table.add_row(name, *(c.show(summary) for c in shown))
    return table


def csv_text(
    columns: Sequence[Column],
    rows: Sequence[tuple[str, Summary]],
    *,
    label: str = "policy",
    extra: Sequence[tuple[str, Callable[[str, Summary], object]]] = (),
) -> str:
    """Every column's raw value, one line per row, with a header line."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*(name for name, _ in extra), label, *(c.key for c in columns)])
    for name, summary in rows:
        writer.writerow(
            [*(get(name, summary) for _, get in extra), name, *(c.value(summary) for c in columns)]
        )
    return out.getvalue()


def json_text(document: Mapping[str, Any]) -> str:
    """The results document as indented JSON."""
    return json.dumps(document, indent=2) + "\n"


def table_console(wide: bool = False) -> Console:
    """The console for result tables: the terminal's, or 80 (``wide``: 220) columns when piped."""
    console = Console()
    if console.is_terminal:
        return console
    return Console(width=_WIDE_WIDTH if wide else NARROW_WIDTH)


def message_console(output: OutputFormat, wide: bool = False) -> Console:
    """Where progress and messages go: stderr when stdout carries JSON or CSV."""
    if output is OutputFormat.TABLE:
        return table_console(wide)
    return Console(stderr=True)


def emit(text: str) -> None:
    """Write machine output to stdout, unwrapped and unstyled."""
    typer.echo(text, nl=False)


def ms(seconds: float | None) -> str:
    """A latency for a table cell: milliseconds below 10 s (a decimal below 10 ms), else seconds."""
    if seconds is None:
        return "-"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f}ms"
    return f"{seconds * 1000:.0f}ms" if seconds < 10 else f"{seconds:.1f}s"


def percent(fraction: float | None, digits: int = 1) -> str:
    """A fraction as a percentage cell (``-`` when unknown)."""
    return "-" if fraction is None else f"{fraction:.{digits}%}"


def field(key: str) -> Callable[[Summary], object]:
    """The raw value of ``key`` in a summary (``None`` when absent)."""
    return lambda s: s.get(key)


def ms_column(header: str, key: str, *, narrow: bool = False) -> Column:
    """A latency column of ``key`` (seconds, shown by ``ms``)."""
    return Column(header, key, lambda s: ms(s.get(key)), field(key), narrow)


def percent_column(header: str, key: str, *, narrow: bool = False) -> Column:
    """A fraction column of ``key``, shown as a percentage."""
    return Column(header, key, lambda s: percent(s.get(key)), field(key), narrow)


def ratio_column(header: str, key: str, *, narrow: bool = False) -> Column:
    """A number column of ``key`` with two decimals (a ratio, a rate)."""
    return Column(header, key, lambda s: f"{s[key]:.2f}", field(key), narrow)


def count_column(header: str, key: str, *, narrow: bool = False) -> Column:
    """A count column of ``key``."""
    return Column(header, key, lambda s: str(s[key]), field(key), narrow)


DONE = Column("done", "finished", lambda s: f"{s['finished']}/{s['requests']}", field("finished"))
"""Requests finished over requests sent."""

LATENCIES: tuple[Column, ...] = (
    ms_column("TTFT p50", "ttft_p50", narrow=True),
    ms_column("p90", "ttft_p90"),
    ms_column("p99", "ttft_p99", narrow=True),
    ms_column("e2e p50", "e2e_p50"),
    ms_column("e2e p99", "e2e_p99"),
)
"""Time to first token and end to end, as both reports show them."""


def _points(cause: str) -> Column:
    def show(s: Mapping[str, Any]) -> str:
        return f"{s['misses']['points'][cause]:.2f}"

    def value(s: Mapping[str, Any]) -> object:
        return s["misses"]["points"][cause]

    return Column(cause.removeprefix("turn_"), cause, show, value, narrow=True)


def _recomputed(s: Mapping[str, Any]) -> int | None:
    shared = s["misses"].get("requests", {}).get("shared")
    return None if shared is None else int(shared)


def _show_recomputed(s: Mapping[str, Any]) -> str:
    n = _recomputed(s)
    return "-" if n is None else str(n)


MISSES_COLUMNS: tuple[Column, ...] = (
    percent_column("hit", "hit_rate", narrow=True),
    *(_points(cause) for cause in CAUSES),
    Column("recomp", "shared_requests", _show_recomputed, _recomputed, narrow=True),
)
"""``kvgate sim --misses``: points of the prompt tokens computed, by cause (``workload.misses``)."""


def causes_table(
    rows: Sequence[tuple[str, Mapping[str, Any]]],
    note: str = "",
    *,
    live: bool = False,
    label: str = "policy",
) -> Table | None:
    """``rows`` (name and summary with ``misses``: its ``points`` by cause, and the
    ``requests`` that recomputed shared text where counted) by cause; ``live``: a live
    run's split, whose ``moved`` is an upper bound (``bench.misses``). ``None`` when
    there are none."""
    if not rows:
        return None
    title = "misses by cause, points of prompt tokens (hit + causes = 100)" + note
    caption = (
        "new: no earlier request had it; shared: text others had, recomputed; early/home/moved: "
        "a later turn before its previous one finished / on its worker, evicted / elsewhere. "
        "recomp: requests that recomputed shared text."
    )
    if live:
        caption += " Live, no one reads a worker's cache: moved counts all a moved turn re-sent."
    return rich_table(title, MISSES_COLUMNS, rows, wide=True, label=label, caption=caption)
