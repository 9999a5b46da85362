"""PNG plots of an experiment (matplotlib's object API on the Agg canvas: no display,
no pyplot global state).

``ttft_cdf.png``: TTFT CDF per policy; ``hit_rate.png``: hit rate per policy
against the infinite-cache bound; ``load.png``: per-worker in-flight requests
over time, one panel per policy; ``sweep.png``: hit rate, TTFT p99 and
throughput against the swept parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from kvgate.sim.experiment import PointResult


def plot_ttft_cdf(point: PointResult, path: Path) -> None:
    """TTFT cumulative distribution, one line per policy (log time axis)."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for run in point.runs:
        values = run.recorder.ttft_sorted(200)
        if not values:
            continue
        levels = [i / (len(values) - 1) for i in range(len(values))] if len(values) > 1 else [1.0]
        ax.plot([max(v, 1e-4) for v in values], levels, label=run.policy)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_hit_rate(point: PointResult, path: Path) -> None:
    """Prefix-cache hit rate per policy, with the infinite-cache bound as a line."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    names = [run.policy for run in point.runs]
    rates = [run.summary["hit_rate"] for run in point.runs]
    ax.bar(names, rates, color="tab:blue")
    ax.axhline(point.bound.hit_rate, color="tab:red", linestyle="--", label="infinite-cache bound")
    ax.set_ylim(0, 1)
    ax.set_ylabel("prefix-cache hit rate (tokens)")
    ax.set_title("Hit rate per policy")
    ax.legend()
    ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_load(point: PointResult, path: Path) -> None:
    """Per-worker in-flight requests over time, one panel per policy."""
    n = len(point.runs)
    fig = Figure(figsize=(8, 2.4 * n))
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], point.runs, strict=True):
        series = run.recorder.load
        for i in range(series.workers):
            ax.plot(series.times, [row[i] for row in series.in_flight], linewidth=0.8)
        ax.set_title(run.policy, fontsize=9)
        ax.set_ylabel("in flight")
    axes[-1, 0].set_xlabel("simulated time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_sweep(points: Sequence[PointResult], param: str, path: Path) -> None:
    """Hit rate, TTFT p99 and throughput against the swept parameter, per policy."""
    metrics = (("hit_rate", "hit rate"), ("ttft_p99", "TTFT p99 (s)"), ("throughput", "req/s"))
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
    axes[0].legend(fontsize=8)
    fig.suptitle(f"sweep over {param}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


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
