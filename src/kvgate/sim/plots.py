"""PNG plots of an experiment (matplotlib's object API on the Agg canvas: no display,
no pyplot global state).

``ttft_cdf.png``: TTFT CDF per policy; ``hit_rate.png``: hit rate per policy
against the infinite-cache bound; ``load.png``: the spread of in-flight requests
over the workers in time, one panel per policy on one scale; ``sweep.png``: hit
rate, TTFT p99 and throughput against the swept parameter. Every figure has a
legend and axes labelled in the units people read (%, ms).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, PercentFormatter

from kvgate.sim.experiment import PointResult


def _seconds_label(seconds: float, _pos: object = None) -> str:
    """A tick label in the unit people read latencies in: µs, ms or s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:g} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:g} ms"
    return f"{seconds:g} s"


def _log_time_axis(axis: Any) -> None:
    """A log time axis labelled at 1-2-5 steps in µs/ms/s, minor ticks unlabelled.

    matplotlib's default writes every minor tick as ``3×10⁻²``; the labels then run
    together. Fewer, plainer labels read at a glance.
    """
    axis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(_seconds_label))
    axis.set_minor_locator(LogLocator(base=10.0, subs=tuple(range(1, 10))))
    axis.set_minor_formatter(NullFormatter())


def plot_ttft_cdf(point: PointResult, path: Path) -> Figure:
    """TTFT cumulative distribution, one line per policy (log time axis)."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for run in point.runs:
        values = run.recorder.ttft_sorted(200)
        if not values:
            continue
        levels = [i / (len(values) - 1) for i in range(len(values))] if len(values) > 1 else [1.0]
        ax.plot([max(v, 1e-4) for v in values], levels, label=run.policy, linewidth=1.6)
    ax.set_xscale("log")
    _log_time_axis(ax.xaxis)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("time to first token (log scale)")
    ax.set_ylabel("requests with TTFT at most x")
    ax.set_title(f"TTFT CDF — {point.workload.get('name', 'workload')}")
    ax.grid(True, which="major", alpha=0.35)
    ax.legend(title="policy", loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def plot_hit_rate(point: PointResult, path: Path) -> Figure:
    """Prefix-cache hit rate per policy, with the infinite-cache bound as a line."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    names = [run.policy for run in point.runs]
    rates = [run.summary["hit_rate"] for run in point.runs]
    bars = ax.bar(names, rates, color="tab:blue", label="hit rate")
    # Inside the bars: above them the labels would cross the bound's line.
    ax.bar_label(
        bars, labels=[f"{r:.1%}" for r in rates], label_type="center", color="white", fontsize=10
    )
    bound = point.bound.hit_rate
    ax.axhline(bound, color="tab:red", linestyle="--", label=f"infinite-cache bound ({bound:.1%})")
    ax.set_ylim(0, 1.08)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylabel("prefix-cache hit rate (cached / prompt tokens)")
    ax.set_title("Hit rate per policy")
    ax.legend(loc="upper right", fontsize=9)
    ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def plot_load(point: PointResult, path: Path) -> Figure:
    """Load spread over time: busiest worker, mean and idlest, one panel per policy.

    One line per worker overplots past three or four workers, so each panel shows
    the band between the idlest and the busiest worker with the fleet mean; every
    panel shares one y scale, so the policies compare by eye.
    """
    n = len(point.runs)
    fig = Figure(figsize=(8, 1.9 * n + 0.8))
    axes = fig.subplots(n, 1, sharex=True, sharey=True, squeeze=False)
    for ax, run in zip(axes[:, 0], point.runs, strict=True):
        series = run.recorder.load
        times = series.times
        rows = series.in_flight
        if rows:
            top = [max(row) for row in rows]
            low = [min(row) for row in rows]
            mean = [sum(row) / len(row) for row in rows]
            ax.fill_between(
                times, low, top, step="post", color="tab:orange", alpha=0.25,
                label="idlest to busiest worker",
            )  # fmt: skip
            ax.step(times, top, where="post", color="tab:red", linewidth=0.9, label="busiest")
            ax.step(times, mean, where="post", color="tab:blue", linewidth=1.4, label="mean")
        ax.set_title(
            f"{run.policy}  (requests served per worker: max/mean "
            f"{run.summary['load_max_over_mean']:.2f}, CV {run.summary['load_cv']:.2f})",
            fontsize=9,
            loc="left",
        )
        ax.set_ylabel("in flight")
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize=8, ncol=3)
    axes[-1, 0].set_xlabel("simulated time (s)")
    fig.suptitle(f"Requests in flight per worker ({series.workers} workers)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def plot_sweep(points: Sequence[PointResult], param: str, path: Path) -> Figure:
    """Hit rate, TTFT p99 and throughput against the swept parameter, per policy."""
    metrics = (("hit_rate", "hit rate"), ("ttft_p99", "TTFT p99"), ("throughput", "req/s"))
    fig = Figure(figsize=(13, 4))
    axes = fig.subplots(1, len(metrics))
    numeric = all(isinstance(p.value, int | float) for p in points)
    xs = [p.value if numeric else str(p.value) for p in points]
    policies = [run.policy for run in points[0].runs]
    for ax, (key, label) in zip(axes, metrics, strict=True):
        for name in policies:
            ys = [next(r.summary[key] for r in p.runs if r.policy == name) for p in points]
            ax.plot(xs, ys, marker="o", label=name)
        if key == "hit_rate":
            ax.plot(xs, [p.bound.hit_rate for p in points], "k--", label="bound")
        ax.set_xlabel(param)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if key == "hit_rate":
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        elif key == "ttft_p99":
            ax.yaxis.set_major_formatter(FuncFormatter(_seconds_label))
    axes[0].legend(fontsize=8, title="policy")
    fig.suptitle(f"sweep over {param}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def write_plots(points: Sequence[PointResult], out: Path, sweep_param: str | None) -> list[Path]:
    """Every plot of the experiment into ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    first = points[0]
    written = [out / "ttft_cdf.png", out / "hit_rate.png", out / "load.png"]
    plot_ttft_cdf(first, written[0])
    plot_hit_rate(first, written[1])
    plot_load(first, written[2])
    if sweep_param is not None:
        written.append(out / "sweep.png")
        plot_sweep(points, sweep_param, written[-1])
    return written
