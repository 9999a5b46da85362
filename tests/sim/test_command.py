"""``kvgate sim`` through its command line (typer's CliRunner, small runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kvgate.sim import command


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """A root so ``sim`` stays a subcommand, as under ``kvgate``."""

    command.register(app)
    return app


def test_sim_out_writes_results_json_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        "sim",
        "--workload",
        "system-prompt:prompts=12",
        "--workers",
        "2",
        "--policies",
        "round_robin,prefix_affinity",
        "--requests",
        "150",
        "--kv-blocks",
        "300",
        "--seed",
        "3",
        "--no-progress",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    assert "prefix_affinity" in result.output
    results = json.loads((out / "results.json").read_text())
    assert 0.0 < results["bound_hit_rate"] <= 1.0
    # The fleet's KV (2 workers x 300 blocks) as one LRU cache: at most the bound.
    assert results["reference"]["capacity_blocks"] == 600
    assert 0.0 < results["reference_hit_rate"] <= results["bound_hit_rate"]
    assert set(results["policies"]) == {"round_robin", "prefix_affinity"}
    for entry in results["policies"].values():
        for key in ("hit_rate", "ttft_p50", "ttft_p99", "throughput"):
            assert isinstance(entry[key], float)
        assert entry["ttft_p50"] <= entry["ttft_p99"]
        assert entry["requests"] == 150
        # The file holds the reference's hit rate rounded: allow that rounding.
        assert entry["hit_rate_of_reference"] == pytest.approx(
            entry["hit_rate"] / results["reference_hit_rate"], abs=2e-6
        )
    assert "/ref" in result.output
    for name in ("ttft_cdf.png", "hit_rate.png", "load.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")


def test_sim_sweep_writes_a_sweep_plot(tmp_path: Path) -> None:
    args = [
        "sim",
        "--workload",
        "chat",
        "--workers",
        "2",
        "--policies",
        "least_request",
        "--requests",
        "80",
        "--sweep",
        "rate=2,8",
        "--no-progress",
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["sweep"]["param"] == "rate"
    assert results["sweep"]["values"] == [2, 8]
    assert [p["workload"]["rate"] for p in results["sweep"]["points"]] == [2.0, 8.0]
    assert (tmp_path / "sweep.png").exists()


def test_sim_rejects_bad_input() -> None:
    runner = CliRunner()
    app = make_app()
    unknown = runner.invoke(app, ["sim", "--workload", "chat", "--policies", "nope"])
    assert unknown.exit_code != 0
    both = runner.invoke(app, ["sim", "--workload", "chat", "--trace", "x.jsonl"])
    assert both.exit_code != 0
    neither = runner.invoke(app, ["sim", "--workers", "2"])
    assert neither.exit_code != 0
