"""Refusing is not winning: a request refused or failed counts as a miss and a TTFT of +inf."""

from __future__ import annotations

import math
from array import array

import numpy as np
import pytest

from kvgate.bench.client import Answer
from kvgate.bench.replay import Outcome
from kvgate.bench.report import summarize
from kvgate.judge.protocol import judge, judge_scenario, record
from kvgate.judge.report import markdown, summary_cells
from kvgate.judge.scenarios import Criterion, Scenario
from kvgate.judge.stats import LOSS, MET
from kvgate.sim.simulation import SimConfig, Simulation
from kvgate.workload.recorder import RunRecorder, unbounded_percentile
from kvgate.workload.synthetic import build_workload

INF = math.inf


def test_a_percentile_without_unanswered_requests_is_numpys() -> None:
    values = [0.3, 0.1, 0.7, 0.2, 0.9]
    for q in (0, 50, 90, 99, 100):
        assert unbounded_percentile(values, 0, q) == float(np.percentile(values, q))
    assert unbounded_percentile([], 0, 99) == 0.0


def test_unanswered_requests_sort_last_as_unbounded() -> None:
    answered = [float(i) for i in range(1, 100)]  # 99 answered, then refused ones
    # One refused of 100: p99 interpolates toward it (rank 98.01): unbounded.
    assert unbounded_percentile(answered, 1, 99) == INF
    # The p50 reads the answered ones at its rank among all 100 (49.5: 50.5 s).
    assert unbounded_percentile(answered, 1, 50) == pytest.approx(50.5)
    assert unbounded_percentile(answered, 1, 50) > float(np.percentile(answered, 50))
    # Exactly at an answered rank stays bounded; nothing answered is unbounded.
    assert unbounded_percentile([1.0, 2.0], 1, 50) == 2.0
    assert unbounded_percentile([], 3, 50) == INF


def test_the_recorder_counts_an_unanswered_request_as_a_miss_that_never_answered() -> None:
    recorder = RunRecorder(["w0"])
    for i in range(9):
        recorder.finish(0, ttft=0.1 * (i + 1), e2e=1.0, queued=0.0, prompt_tokens=100,
                        cached_tokens=50, output_tokens=4, now=1.0, returning=i < 3)  # fmt: skip
    recorder.shed("queue_full")
    recorder.unanswered_request(300, returning=True)
    counted = recorder.counting_unanswered()
    assert recorder.hit_rate == 0.5  # over the answered: what the judge no longer reads
    assert counted["hit_rate"] == pytest.approx(450 / 1200)
    assert counted["ttft_p99"] == INF and counted["ttft_return_p99"] == INF
    # Rank 4.5 of ten (nine answered, 0.1 to 0.9 s, then the refused one): 0.55 s.
    assert counted["ttft_p50"] == pytest.approx(0.55)
    # Another clock for the answered (a worker's own), the same refusals.
    other = recorder.counting_unanswered(array("d", [1.0] * 9), array("d", [1.0] * 3))
    assert other["ttft_p50"] == 1.0 and other["ttft_p99"] == INF


def test_a_simulated_router_that_sheds_has_an_unbounded_p99_and_loses_hits() -> None:
    admission = SimConfig().admission.model_copy(
        update={"worker_max_in_flight": 2, "queue_size": 10, "max_wait_standard_s": 0.5}
    )
    config = SimConfig(workers=2, admission=admission, max_requests=400)
    workload = build_workload("rag:rate=200", seed=1)
    run = Simulation(config, workload.requests(), "least_request").run()
    recorder, summary = run.recorder, run.summary
    assert summary["shed"] > 4  # over 1% of 400
    assert recorder.unanswered == summary["shed"] == summary["requests"] - summary["finished"]
    counted = recorder.counting_unanswered()
    assert summary["ttft_p99"] < INF and counted["ttft_p99"] == INF
    assert counted["ttft_p50"] >= summary["ttft_p50"]
    assert counted["hit_rate"] < summary["hit_rate"]


def test_a_request_no_worker_could_run_is_not_held_against_the_router() -> None:
    workload = build_workload("uniform:rate=20,prompt_tokens=256,output_tokens=16", seed=3)
    # Ten 16-token blocks hold few of these requests: the worker answers the rest 400.
    small = SimConfig(workers=2, kv_blocks=(10,), block_size=16, max_requests=20)
    run = Simulation(small, workload.requests(), "round_robin").run()
    assert run.summary["sheds"]["too_long"] > 10
    assert run.recorder.unanswered == 0
    # One worker could have: what round robin sends to the other counts against it.
    mixed = SimConfig(workers=2, kv_blocks=(10, 1000), block_size=16, max_requests=20)
    run = Simulation(mixed, workload.requests(), "round_robin").run()
    assert 0 < run.summary["sheds"]["too_long"] <= 10
    assert run.recorder.unanswered == run.summary["sheds"]["too_long"]


def _answer(n: int, status: int, *, ttft: float = 0.2, returning: bool = False) -> Outcome:
    ok = status == 200
    answer = Answer(
        sent=float(n),
        finished=n + 0.5,
        first_token=n + 0.1 if ok else None,
        status=status,
        error=None if ok else f"HTTP {status}: x",
        prompt_tokens=100 if ok else None,
        cached_tokens=80 if ok else None,
        completion_tokens=4 if ok else None,
        worker="w0" if ok else None,
        worker_ttft=ttft if ok else None,
    )
    return Outcome(f"r{n}", None, float(n), float(n), answer, returning, 100)


def test_a_live_summary_counts_refused_and_failed_but_not_the_engines_400() -> None:
    outcomes = [_answer(i, 200, ttft=0.1 * (i + 1)) for i in range(7)]
    outcomes += [_answer(7, 429), _answer(8, 503, returning=True), _answer(9, 400)]
    assert "counting_unanswered" not in summarize(outcomes)  # +inf is no strict JSON
    summary = summarize(outcomes, workers=["w0"], count_unanswered=True)
    assert summary["hit_rate"] == 0.8  # the answered only, as before
    counted = summary["counting_unanswered"]
    assert counted["unanswered"] == 2  # the 400 is the request's own (longer than the context)
    assert counted["hit_rate"] == pytest.approx(560 / 900)
    assert counted["ttft_p99"] == INF and summary["worker_ttft_p99"] < 1.0
    assert counted["ttft_return_p50"] == INF  # the one returning turn failed
    # Answers without the workers' clock give no TTFT to judge (as before).
    plain = [_answer(0, 200), _answer(1, 429)]
    plain[0].answer.worker_ttft = None
    counted = summarize(plain, count_unanswered=True)["counting_unanswered"]
    assert "ttft_p50" not in counted and "ttft_return_p50" not in counted


SHAPE = Scenario(
    name="toy",
    workload="uniform",
    requests=100,
    why="a test",
    criteria=(Criterion("hit_rate", "best_peer", 1.0), Criterion("ttft_p99", "best_peer", 1.05)),
)
ROLES = {"mine": "own", "peer": "peer", "rr": "baseline"}


def _runs(p99: dict[str, list[float]], hit: float = 0.5) -> list[dict[str, object]]:
    return [
        record(SHAPE, seed, name, ROLES[name], mode="sim", hit_rate=hit, ttft_p50=1.0,
               ttft_p99=value, requests=100, finished=100 if value < INF else 90,
               shed=0 if value < INF else 10, unanswered=0 if value < INF else 10)
        for name, values in p99.items()
        for seed, value in enumerate(values)
    ]  # fmt: skip


def test_the_router_that_refused_loses_the_bar_and_a_peers_refusals_count_against_it() -> None:
    # Faster at p99 on two seeds, unbounded on the third (it refused 10%).
    refusing = {"mine": [1.0, 1.0, INF], "peer": [2.0, 2.0, 2.0], "rr": [3.0, 3.0, 3.0]}
    j = judge_scenario(SHAPE, "sim", _runs(refusing))
    assert j is not None
    p99 = next(b for b in j["bars"] if b["metric"] == "ttft_p99")
    assert p99["estimate"]["value"] == INF and p99["verdict"] == LOSS
    assert j["verdict"] == LOSS
    assert j["refused"] == {"mine": 10, "peer": 0, "rr": 0}
    # The peer refused on one seed: its unbounded p99 is what the judged router is
    # compared with there, and the one bounded peer is the best.
    answered = {"mine": [2.1, 2.1, 2.1], "peer": [2.0, 2.0, INF], "rr": [3.0, 3.0, 3.0]}
    j = judge_scenario(SHAPE, "sim", _runs(answered))
    assert j is not None
    p99 = next(b for b in j["bars"] if b["metric"] == "ttft_p99")
    assert p99["estimate"]["value"] == 0.0 and p99["verdict"] == MET
    assert j["answered_only"] == 0


def test_the_tables_say_unbounded_and_flag_runs_judged_on_the_answered_only() -> None:
    runs = _runs({"mine": [1.0, INF], "peer": [2.0, 2.0], "rr": [3.0, 3.0]})
    text = markdown(judge([SHAPE], runs))
    assert "TTFT p99 <= 1.05x best peer | peer | ∞x [∞, ∞] | LOSS |" in text
    assert "∞ (unanswered) / 2.00 s (peer)" in text
    # A run saved before refusals counted (no ``unanswered``) and that refused some.
    old = _runs({"mine": [1.0, 1.0], "peer": [2.0, 2.0]})
    old[0].pop("unanswered")
    old[0]["shed"] = 3
    j = judge_scenario(SHAPE, "sim", old)
    assert j is not None and j["answered_only"] == 1
    assert "(1 runs judged on the answered only)" in summary_cells(j)[1]
