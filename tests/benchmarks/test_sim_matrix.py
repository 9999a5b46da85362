"""``benchmarks/sim_matrix.py``: its cases run, and a saved run compares beside a new one."""

from __future__ import annotations

from pathlib import Path

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
    plain = matrix.run_case(case, ("default",), tmp_path)
    slow = matrix.run_case(case, ("default",), tmp_path, ("prefill_tokens_per_s=100",))
    # A hundredth of the prefill rate makes every cache worth far more than any queue.
    assert plain[0]["hit_rate"] != slow[0]["hit_rate"]
