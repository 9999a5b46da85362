"""The simulator's plots are readable: legends, plain tick labels, one scale per figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.sim.experiment import Experiment, PointResult
from kvgate.sim.plots import plot_hit_rate, plot_load, plot_sweep, plot_ttft_cdf
from kvgate.sim.simulation import SimConfig
from kvgate.workload.options import workload_factory

POLICIES = ["round_robin", "default", "consistent_hash", "prefix_affinity"]


@pytest.fixture(scope="module")
def points() -> list[PointResult]:
    make = workload_factory(workload="chat", trace=None, seed=1, rate_scale=1.0)
    config = SimConfig(workers=8, seed=1, max_requests=200)
    return Experiment(make, POLICIES, config, {}, "rate_scale", ["1", "2"]).run()


def test_ttft_axis_is_labelled_in_milliseconds_without_crowding(
    points: list[PointResult], tmp_path: Path
) -> None:
    fig = plot_ttft_cdf(points[0], tmp_path / "ttft.png")
    (ax,) = fig.axes
    fig.canvas.draw()
    major = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    minor = [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    assert major and not minor
    assert all(label.endswith((" ms", " s", " µs")) for label in major), major
    assert "×" not in "".join(major) and "10^" not in "".join(major)
    legend = ax.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == POLICIES
    assert (tmp_path / "ttft.png").stat().st_size > 0


def test_load_has_a_legend_and_one_y_scale_for_every_policy(
    points: list[PointResult], tmp_path: Path
) -> None:
    fig = plot_load(points[0], tmp_path / "load.png")
    assert len(fig.axes) == len(POLICIES)
    limits = {ax.get_ylim() for ax in fig.axes}
    assert len(limits) == 1  # shared: the panels compare by eye
    legend = fig.axes[0].get_legend()
    assert legend is not None
    assert {t.get_text() for t in legend.get_texts()} == {
        "idlest to busiest worker",
        "busiest",
        "mean",
    }
    # Three artists per panel, not one line per worker.
    assert all(len(ax.get_lines()) <= 2 for ax in fig.axes)


def test_hit_rate_and_sweep_have_legends_and_percent_axes(
    points: list[PointResult], tmp_path: Path
) -> None:
    bars = plot_hit_rate(points[0], tmp_path / "hit.png")
    (ax,) = bars.axes
    bars.canvas.draw()
    assert ax.get_legend() is not None
    assert all(t.get_text().endswith("%") for t in ax.get_yticklabels() if t.get_text())
    sweep = plot_sweep(points, "rate_scale", tmp_path / "sweep.png")
    assert sweep.axes[0].get_legend() is not None
