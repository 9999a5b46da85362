"""``benchmarks/report.py``: saved judge runs are judged again by today's protocol."""

from __future__ import annotations

from typing import Any

from kvgate.judge.protocol import record
from kvgate.judge.scenarios import SCENARIOS

from .loading import load_benchmark


def test_a_saved_judge_document_is_judged_again_and_its_old_refusals_flagged() -> None:
    report = load_benchmark("report")
    scenario = SCENARIOS["agent-tools"]
    # Runs saved before refusals counted: no ``unanswered``, some shed.
    runs = [
        record(scenario, seed, name, role, mode="sim", hit_rate=0.9, ttft_p50=1.0, ttft_p99=2.0,
               ttft_return_p50=1.0, ttft_return_p99=2.0, requests=100, finished=95, shed=5)
        for seed in range(3)
        for name, role in (("default", "own"), ("cache_aware", "peer"), ("round_robin", "baseline"))
    ]  # fmt: skip
    saved: dict[str, Any] = {"plan": {"sim_seeds": [0, 1, 2]}, "runs": runs, "judgments": []}
    again = report.rejudged(saved)
    assert again["runs"] == runs and again["plan"] == saved["plan"]
    (judged,) = again["judgments"]
    assert judged["scenario"] == "agent-tools" and judged["answered_only"] == 9
