"""``benchmarks/judge.py``: a thin command over ``kvgate.judge`` (one tiny run, then re-judged)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .loading import load_benchmark

judge = load_benchmark("judge")


def test_the_command_runs_a_scenario_and_rejudges_merged_saved_runs(tmp_path: Path) -> None:
    first, again, merged = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "m.json"
    base = ["--scenarios", "groups-16x8-tight", "--option", "warm_min_blocks=0"]
    judge.main([*base, "--seeds", "1-2", "--json", str(first)])
    judge.main([*base, "--seeds", "2", "--json", str(again)])
    table = tmp_path / "t.md"
    judge.main(["--rows", str(first), "--rows", str(again), "--json", str(merged),
                "--markdown", str(table)])  # fmt: skip
    saved = json.loads(merged.read_text())
    assert saved["plan"]["own_options"] == {"warm_min_blocks": "0"}
    assert len(saved["runs"]) == 6  # two seeds x three routers, seed 2 from the later file
    (j,) = saved["judgments"]
    assert j["scenario"] == "groups-16x8-tight" and j["seeds"] == [1, 2]
    assert "| groups-16x8-tight | sim | 2 |" in table.read_text()
    with pytest.raises(SystemExit):
        judge.main(["--scenarios", "nope"])
