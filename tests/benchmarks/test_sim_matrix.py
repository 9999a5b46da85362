"""``benchmarks/sim_matrix.py``: its cases run, and a saved run compares beside a new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from .loading import load_benchmark

matrix = load_benchmark("sim_matrix")


def test_every_case_names_a_workload_or_a_trace_and_the_sets_do_not_repeat_a_row() -> None:
    for cases in (matrix.regression_cases(), matrix.unseen_cases()):
        names = [c.name for c in cases]
        assert len(names) == len(set(names))
        assert all("--workload" in c.args or c.trace is not None for c in cases)


def test_a_small_case_runs_each_policy_and_compares_with_a_saved_run(tmp_path: Path) -> None:
    case = matrix.Case("tiny", ("--workload", "chat", "--requests", "40", "--seed", "3"))
    rows = matrix.run_case(case, ("default", "round_robin"), tmp_path)
    assert [r["policy"] for r in rows] == ["default", "round_robin"]
    assert all(r["finished"] + r["shed"] == r["requests"] == 40 for r in rows)
    assert all(0.0 <= r["hit_rate"] <= 1.0 and r["ttft_p99"] > 0 for r in rows)
    # The simulator is deterministic: the same case again gives the same figures.
    assert matrix.run_case(case, ("default", "round_robin"), tmp_path) == rows
    console = Console(width=200, record=True)
    console.print(matrix.table(rows, [{**rows[0], "hit_rate": 0.5}]))
    text = console.export_text()
    assert "50.0%" in text and f"{rows[0]['hit_rate']:.1%}" in text
    assert "-" in text.splitlines()[-2]  # round_robin had no row before


def test_a_missing_trace_skips_its_row(tmp_path: Path) -> None:
    assert matrix.run_case(matrix.Case("t", (), "nope.jsonl"), ("default",), tmp_path) == []


def test_an_option_reaches_the_policy(tmp_path: Path) -> None:
    case = matrix.Case("tiny", ("--workload", "chat", "--requests", "40", "--seed", "3"))
    plain = matrix.run_case(case, ("default",), tmp_path, ("warm_min_blocks=0",))
    options = ("warm_min_blocks=0", "threshold=0.01")
    busy = matrix.run_case(case, ("default",), tmp_path, options)
    # A session's worker counts as too busy at 1% of its capacity: sessions leave it.
    assert plain[0]["hit_rate"] != busy[0]["hit_rate"]


def _row(case: str, hit: float, p99: float, policy: str = "default") -> dict[str, object]:
    figures = {"hit_rate": hit, "ttft_p99": p99, "load_max_over_mean": 1.0, "shed": 0}
    return {"case": case, "policy": policy, **figures}


def test_the_change_is_summed_up_per_policy_over_the_rows_in_both_runs() -> None:
    before = [_row("a", 0.80, 1.0), _row("b", 0.50, 2.0), _row("c", 0.70, 1.0)]
    before.append(_row("a", 0.60, 1.0, "cache_aware"))
    rows = [_row("a", 0.82, 2.0), _row("b", 0.497, 0.5), _row("c", 0.66, 1.0)]
    rows += [_row("a", 0.60, 1.0, "cache_aware"), _row("new", 0.9, 1.0)]
    summary = matrix.changes(rows, before)
    default = summary["default"]
    assert default["rows"] == 3  # "new" had no row before
    assert default["mean"] == pytest.approx((2.0 - 0.3 - 4.0) / 3)
    assert (default["ahead"], default["behind"]) == (1, 1)  # b moved -0.3: neither
    assert default["worst"] == ("c", pytest.approx(-4.0))
    assert default["best"] == ("a", pytest.approx(2.0))
    assert default["p99_ratio"] == pytest.approx((2.0 * 0.25 * 1.0) ** (1 / 3))
    low, high = default["interval"]
    assert low < default["mean"] < high and high - low > 4  # three rows, wide apart
    assert summary["cache_aware"]["interval"] is None  # one row: no interval
    console = Console(width=200, record=True)
    console.print(matrix.changes_table(summary))
    text = console.export_text()
    assert "-0.77" in text and "-4.00 c" in text


def test_two_saved_runs_compare_without_simulating(tmp_path: Path) -> None:
    old, new, out = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "out.json"
    old.write_text(json.dumps({"set": "all", "options": [], "rows": [_row("a", 0.5, 1.0)]}))
    new.write_text(json.dumps({"set": "all", "options": ["x=1"], "rows": [_row("a", 0.6, 1.0)]}))
    matrix.main(["--compare", str(old), "--rows", str(new), "--json", str(out)])
    document = json.loads(out.read_text())
    assert document["options"] == ["x=1"]
    assert document["changes"]["default"]["mean"] == pytest.approx(10.0)
    with pytest.raises(SystemExit):
        matrix.main(["--rows", str(new)])
