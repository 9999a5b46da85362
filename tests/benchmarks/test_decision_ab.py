"""``benchmarks/decision_ab.py``: two trees' decision times in one process, round by round."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .loading import BENCHMARKS, load_benchmark

ab = load_benchmark("decision_ab")


def test_each_tree_keeps_its_least_time_and_the_rounds_ratios_are_paired() -> None:
    timings = {"new": [(100.0, 80.0), (120.0, 84.0), (90.0, 81.0)]}
    (row,) = ab.summarize(timings)
    assert row["requests"] == "new"
    assert (row["base_us"], row["head_us"]) == (90.0, 80.0)
    assert row["ratio"] == pytest.approx(80.0 / 90.0)
    # Rounds' ratios 0.8, 0.7, 0.9: median 0.8, range 0.7-0.9.
    assert row["round_ratio_median"] == pytest.approx(0.8)
    assert (row["round_ratio_min"], row["round_ratio_max"]) == (
        pytest.approx(0.7),
        pytest.approx(0.9),
    )


def test_the_command_times_a_revision_beside_this_tree(tmp_path: Path) -> None:
    root = BENCHMARKS.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    out = tmp_path / "ab.json"
    command = [sys.executable, str(BENCHMARKS / "decision_ab.py"), "--base", "HEAD",
               "--workers", "4", "--sessions", "40", "--picks", "10", "--rounds", "2",
               "--json", str(out)]  # fmt: skip
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, cwd=root, timeout=300
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert [r["requests"] for r in doc["rows"]] == ["known", "new", "headerless"]
    assert all(r["base_us"] > 0 and r["head_us"] > 0 for r in doc["rows"])
    worktrees = subprocess.run(
        ["git", "worktree", "list"], capture_output=True, text=True, cwd=root, check=True
    )
    assert "kvgate-ab-" not in worktrees.stdout  # the base's checkout is gone


def test_an_unknown_revision_is_a_clear_error() -> None:
    root = BENCHMARKS.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    command = [sys.executable, str(BENCHMARKS / "decision_ab.py"), "--base", "no-such-rev"]
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, cwd=root, timeout=60
    )
    assert done.returncode != 0
    assert "git worktree add no-such-rev" in done.stderr
