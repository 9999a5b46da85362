"""``kvgate sim`` through its command line (typer's CliRunner, small runs)."""

from __future__ import annotations

import csv
import io
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
    stray = runner.invoke(app, ["sim", "--workload", "chat", "--as-peer", "cache_aware"])
    assert stray.exit_code != 0 and "not among the policies: cache_aware" in stray.output


SMALL = ["sim", "--workload", "system-prompt:prompts=12", "--workers", "2", "--requests", "120"]
SMALL += ["--policies", "round_robin,prefix_affinity,consistent_hash", "--kv-blocks", "300"]


def test_the_default_table_fits_80_columns_and_wide_shows_every_column() -> None:
    narrow = CliRunner().invoke(make_app(), [*SMALL, "--no-progress"], terminal_width=80)
    assert narrow.exit_code == 0, narrow.output
    lines = narrow.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert "…" not in narrow.stdout  # nothing cut to make it fit
    header = next(line for line in lines if "policy" in line)
    assert "TTFT p50" in header and "preempt" not in header
    wide = CliRunner().invoke(make_app(), [*SMALL, "--no-progress", "--wide"])
    assert wide.exit_code == 0, wide.output
    header = next(line for line in wide.stdout.splitlines() if "policy" in line)
    for column in ("req/s", "p90", "queue", "CV", "migr", "preempt", "sim/min"):
        assert column in header, column


def test_csv_and_json_go_to_stdout_alone() -> None:
    as_csv = CliRunner().invoke(make_app(), [*SMALL, "--format", "csv"])
    assert as_csv.exit_code == 0, as_csv.output
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [r["policy"] for r in rows] == ["round_robin", "prefix_affinity", "consistent_hash"]
    assert all(0.0 <= float(r["hit_rate"]) <= 1.0 for r in rows)
    as_json = CliRunner().invoke(make_app(), [*SMALL, "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert set(data["policies"]) == {"round_robin", "prefix_affinity", "consistent_hash"}
    by_csv = {r["policy"]: float(r["hit_rate"]) for r in rows}
    assert by_csv == {p: s["hit_rate"] for p, s in data["policies"].items()}


def test_a_sweep_in_csv_has_one_row_per_point_and_policy() -> None:
    args = [*SMALL[:-4], "--policies", "round_robin", "--sweep", "workers=2,3", "--format", "csv"]
    result = CliRunner().invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(r["sweep_value"], r["policy"]) for r in rows] == [
        ("2", "round_robin"),
        ("3", "round_robin"),
    ]


def test_sim_caps_the_clients_requests_out_as_the_live_replay_does() -> None:
    runner = CliRunner()
    base = ["sim", "--workload", "shared-opening-trace:rate=20", "--workers", "2"]
    base += ["--requests", "60", "--kv-blocks", "10000", "--block-size", "16"]
    base += ["--policies", "round_robin", "--no-progress", "--format", "json"]
    capped = runner.invoke(make_app(), [*base, "--client-concurrency", "2"])
    assert capped.exit_code == 0, capped.output
    summary = json.loads(capped.stdout)["policies"]["round_robin"]
    assert summary["client_queued"] > 0 and summary["finished"] == 60
    free = runner.invoke(make_app(), base)
    assert json.loads(free.stdout)["policies"]["round_robin"]["client_queued"] == 0
    zero = runner.invoke(make_app(), [*base, "--client-concurrency", "0"])
    assert zero.exit_code != 0


def test_sim_slows_a_worker_mid_run_and_refuses_a_bad_slowdown() -> None:
    runner = CliRunner()
    base = ["sim", "--workload", "uniform:rate=40", "--workers", "2", "--requests", "200"]
    base += ["--block-size", "16", "--client-concurrency", "16", "--policies", "round_robin"]
    base += ["--no-progress", "--format", "json"]
    fast = runner.invoke(make_app(), base)
    slow = runner.invoke(make_app(), [*base, "--slowdown", "2:0:0.25"])
    assert fast.exit_code == 0 and slow.exit_code == 0, slow.output
    before, after = (json.loads(r.stdout)["policies"]["round_robin"] for r in (fast, slow))
    assert after["ttft_p99"] > before["ttft_p99"]
    for bad in ("2:5:0.5", "2:0:0", "soon"):
        refused = runner.invoke(make_app(), [*base, "--slowdown", bad])
        assert refused.exit_code != 0, bad
