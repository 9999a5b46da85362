"""``benchmarks/real_engine.py``: the order policies run in, and the gateway it configures."""

from __future__ import annotations

from pathlib import Path

from .loading import load_benchmark


def test_each_policy_goes_first_as_often_over_consecutive_seeds() -> None:
    bench = load_benchmark("real_engine")
    two = ["default", "round_robin"]
    assert [bench.run_order(two, seed) for seed in range(3)] == [
        ["default", "round_robin"],
        ["round_robin", "default"],
        ["default", "round_robin"],
    ]
    three = ["a", "b", "c"]
    firsts = [bench.run_order(three, seed)[0] for seed in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    assert sorted(bench.run_order(three, 4)) == three and bench.run_order([], 3) == []


def test_llamacpp_workers_are_configured_as_the_docs_say(tmp_path: Path) -> None:
    bench = load_benchmark("real_engine")
    urls = ["http://w0", "http://w1"]
    pinned = bench.gateway_config(urls, "default", None, tmp_path)
    assert [w["engine"] for w in pinned["workers"]] == ["llamacpp", "llamacpp"]
    assert pinned["slots"] == {"dir": str(tmp_path)}
    plain = bench.gateway_config(urls, "round_robin", {"x": 1}, None)
    assert all("engine" not in w for w in plain["workers"]) and "slots" not in plain
    assert plain["policy"] == {"name": "round_robin", "options": {"x": 1}}


def test_each_turn_is_matched_to_what_the_gateway_predicted_and_booked_by_its_own_id() -> None:
    """The gateway keys its books by its own id (``X-Kvgate-Request-ID``), never the
    client's: a turn finds its prediction and the uncached tokens it was booked at there."""
    from kvgate.bench.client import Answer

    bench = load_benchmark("real_engine")
    answer = Answer(sent=0.0, finished=2.0, first_token=0.5, status=200, worker="w")
    answer.prompt_tokens, answer.cached_tokens, answer.gateway_id = 1_000, 900, "g1"
    run = bench.PolicyRun("default", turns=[bench.Turn("s0", 0, answer)])
    run.predictions = {"g1": (0.4, 0.5, 60.0), "g2": (1.0, 2.0, 10.0)}
    summary = bench.summarize(run, ["w"], 1.0)
    (turn,) = summary["turns"]
    assert (turn["predicted"], turn["gateway_ttft"], turn["booked_uncached"]) == (0.4, 0.5, 60.0)
    assert summary["guess_error_tokens"] == 40.0  # booked 60, usage says 100
    assert summary["predicted"] == 2  # the error is over every request the gateway observed
