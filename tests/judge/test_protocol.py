"""The protocol: scenarios picked up from the registry, runs paired by seed, bars judged."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.judge.protocol import judge_scenario, parse_seeds, record
from kvgate.judge.scenarios import (
    A100,
    H100,
    SCENARIOS,
    UNJUDGED,
    Criterion,
    Scenario,
    Slowdown,
    by_names,
    judged,
)
from kvgate.judge.simulated import SIM_ROUTERS, run_simulated
from kvgate.judge.stats import LOSS, MET, OPEN
from kvgate.workload.synthetic import WORKLOADS


def test_every_registered_workload_is_judged_unless_named_unjudged() -> None:
    names = [s.name for s in judged()]
    assert names[: len(SCENARIOS)] == list(SCENARIOS)
    # Trace windows (``trace:NAME``, held-out shapes) are not registered workloads.
    ran = {s.workload_name for s in judged()} - {"trace"}
    assert ran | UNJUDGED == set(WORKLOADS)
    # A workload registered later joins on the default fleet with the default bars.
    late = judged([*WORKLOADS, "agent-tool-pauses"])[-1]
    assert late.name == late.workload == "agent-tool-pauses"
    assert [c.metric for c in late.criteria] == ["hit_rate", "ttft_p50", "ttft_p99"]
    with pytest.raises(ValueError, match="unknown scenario"):
        by_names(["nope"])


def test_the_slowed_workers_expected_share_is_its_speed_over_the_fleets() -> None:
    s = SCENARIOS["uniform-mixed-slowdown"]
    assert [s.profile_of(i) for i in range(4)] == [H100, A100, H100, A100]
    # H100 prefill 12,000 tokens/s halved, A100 6,500: 6,000 / 31,000.
    assert s.expected_share() == pytest.approx(6000 / 31000)
    assert SCENARIOS["uniform-mixed"].expected_share() is None


def test_criteria_say_what_they_judge_and_refuse_nonsense() -> None:
    assert Criterion("ttft_p99", "best_peer", 1.05).describe() == "TTFT p99 <= 1.05x best peer"
    assert Criterion("hit_rate", "best_peer", 1).describe() == "hit >= best peer - 1 pt"
    with pytest.raises(ValueError):
        Criterion("ttft_p50", "speed", 1.0)
    with pytest.raises(ValueError):
        Criterion("latency", "best_peer", 1.0)


def test_seeds_parse_as_ranges_and_lists() -> None:
    assert parse_seeds("500-503,7") == [500, 501, 502, 503, 7]
    with pytest.raises(ValueError):
        parse_seeds(" , ")


SHAPE = Scenario(
    name="toy",
    workload="uniform",
    requests=10,
    why="a test",
    slowdown=Slowdown(at_s=1.0, worker=0),
    criteria=(
        Criterion("hit_rate", "best_peer", 1.0),
        Criterion("ttft_p50", "best_peer", 1.05),
        Criterion("ttft_p99", "round_robin", 1.0),
        Criterion("slowed_share", "speed", 0.2),
    ),
)


def _runs(rows: dict[str, list[tuple[float, float, float]]], share: float) -> list[dict[str, Any]]:
    roles = {"mine": "own", "peer-a": "peer", "peer-b": "peer", "rr": "baseline"}
    return [
        record(SHAPE, seed, name, roles[name], mode="sim", hit_rate=hit, ttft_p50=p50,
               ttft_p99=p99, slowed_share=share if name == "mine" else 0.25)
        for name, values in rows.items()
        for seed, (hit, p50, p99) in enumerate(values)
    ]  # fmt: skip


def test_the_best_peer_is_chosen_per_metric_and_bars_are_judged_on_paired_seeds() -> None:
    rows = {
        # The judged router: half a point under peer-a's hit, as fast at p50, slower at p99.
        "mine": [(0.505, 1.0, 4.0), (0.605, 2.0, 8.0), (0.705, 1.5, 6.0)],
        "peer-a": [(0.51, 2.0, 2.0), (0.61, 4.0, 4.0), (0.71, 3.0, 3.0)],  # best hit
        "peer-b": [(0.30, 1.0, 9.0), (0.30, 2.0, 9.0), (0.30, 1.5, 9.0)],  # best p50
        "rr": [(0.10, 3.0, 2.0), (0.10, 3.0, 4.0), (0.10, 3.0, 3.0)],
    }
    # 1/4 of the work where speed says 6,000/(6,000 + 3 x 12,000) = 1/7: 1.75x.
    j = judge_scenario(SHAPE, "sim", _runs(rows, share=0.25))
    assert j is not None
    c = j["comparisons"]
    assert c["hit_rate"]["best_peer"] == "peer-a"
    assert c["hit_rate"]["points"]["value"] == pytest.approx(-0.5)
    assert c["ttft_p50"]["best_peer"] == "peer-b"
    assert c["ttft_p50"]["ratio"]["value"] == pytest.approx(1.0)
    assert c["ttft_p99"]["best_peer"] == "peer-a"
    assert c["ttft_p99"]["ratio"]["value"] == pytest.approx(2.0)
    verdicts = {b["metric"]: b["verdict"] for b in j["bars"]}
    # Half a point under on every seed: within the bar's one point.
    assert verdicts["hit_rate"] == MET
    assert verdicts["ttft_p50"] == MET
    assert verdicts["ttft_p99"] == LOSS  # 2x round robin on every seed
    assert verdicts["slowed_share"] == LOSS
    assert j["verdict"] == LOSS
    assert j["seeds"] == [0, 1, 2]


def test_noisy_seeds_leave_a_bar_open_rather_than_lost() -> None:
    rows = {
        "mine": [(0.5, 1.0, 1.0), (0.5, 3.0, 1.0), (0.5, 1.2, 1.0)],
        "peer-a": [(0.5, 2.0, 1.0), (0.5, 1.0, 1.0), (0.5, 1.0, 1.0)],
        "rr": [(0.5, 1.0, 1.0), (0.5, 1.0, 1.0), (0.5, 1.0, 1.0)],
    }
    j = judge_scenario(SHAPE, "sim", _runs(rows, share=1 / 7))
    assert j is not None
    verdicts = {b["metric"]: b["verdict"] for b in j["bars"]}
    assert verdicts["ttft_p50"] == OPEN
    assert verdicts["slowed_share"] == MET
    assert j["verdict"] == OPEN
    assert judge_scenario(SHAPE, "live", _runs(rows, share=0.2)) is None


def test_a_bar_on_returning_turns_judges_only_those() -> None:
    agents = SCENARIOS["agent-tools"]
    assert [c.metric for c in agents.criteria] == ["hit_rate", "ttft_return_p50", "ttft_return_p99"]
    roles = {"mine": "own", "peer": "peer", "rr": "baseline"}
    # Slower than the peer over all turns, twice as fast on the turns back from a tool.
    runs = [
        record(agents, seed, name, roles[name], mode="live", hit_rate=0.9, ttft_p50=2.0,
               ttft_p99=4.0, ttft_return_p50=back, ttft_return_p99=2 * back)
        for seed in range(3)
        for name, back in (("mine", 0.5 + seed / 10), ("peer", 1.0 + seed / 5), ("rr", 3.0))
    ]  # fmt: skip
    for r in runs:
        if r["router"] != "mine":
            r["ttft_p50"] = 1.0
    j = judge_scenario(agents, "live", runs)
    assert j is not None
    assert j["comparisons"]["ttft_return_p50"]["ratio"]["value"] == pytest.approx(0.5)
    verdicts = {b["metric"]: b["verdict"] for b in j["bars"]}
    assert verdicts == {"hit_rate": MET, "ttft_return_p50": MET, "ttft_return_p99": MET}
    # A scenario without such a bar does not compare them.
    alike = {"mine": [(0.5, 1.0, 1.0)], "peer-a": [(0.5, 1.0, 1.0)]}
    plain = judge_scenario(SHAPE, "sim", _runs(alike, share=0.2))
    assert plain is not None and "ttft_return_p50" not in plain["comparisons"]


def test_a_simulated_scenario_runs_every_router_on_the_seed() -> None:
    small = Scenario(
        name="small",
        workload="shared-prefix-groups:groups=4,prompts=3,rate=100",
        requests=12,
        why="a test",
        kv_blocks=400,
    )
    records = run_simulated(small, 3)
    assert [r["router"] for r in records] == list(SIM_ROUTERS.all)
    assert [r["role"] for r in records] == ["own", "peer", "baseline"]
    assert all(r["finished"] == 12 and r["hit_rate"] > 0 for r in records)
    assert records == run_simulated(small, 3)  # a pure function of scenario and seed


def test_the_section_and_tables_say_what_was_judged() -> None:
    from kvgate.judge.protocol import document, judge
    from kvgate.judge.report import SECTION_TITLE, markdown, section

    rows = {
        "mine": [(0.5, 1.0, 4.0), (0.6, 2.0, 8.0)],
        "peer-a": [(0.5, 2.0, 2.0), (0.6, 4.0, 4.0)],
        "rr": [(0.1, 3.0, 2.0), (0.1, 3.0, 4.0)],
    }
    runs = _runs(rows, share=1 / 7)
    judgments = judge([SHAPE], runs)
    text = markdown(judgments)
    assert "| toy | sim | 2 |" in text
    assert "TTFT p99 <= 1x round robin | rr | 2.00x [2.00, 2.00] | LOSS |" in text
    doc = document([SHAPE], runs, judgments, sim_seeds=[0, 1], own="default")
    page = section([doc], ["benchmarks/judge.py"])
    assert page.startswith(f"## {SECTION_TITLE}")
    assert "simulator seeds 0, 1" in page and "The judged policy: `default`" in page
    assert "4 x h100-llama3-8b, the GPU's KV, 64 in flight; worker 0 at 0.5x speed" in page


def test_merged_runs_take_the_later_files_run_of_the_same_key() -> None:
    from kvgate.judge.protocol import merge_runs

    first = [record(SHAPE, 1, "mine", "own", mode="sim", ttft_p50=1.0),
             record(SHAPE, 2, "mine", "own", mode="sim", ttft_p50=2.0)]  # fmt: skip
    again = [record(SHAPE, 2, "mine", "own", mode="sim", ttft_p50=9.0),
             record(SHAPE, 2, "mine", "own", mode="live", ttft_p50=5.0)]  # fmt: skip
    merged = merge_runs(first, again)
    assert [(r["seed"], r["mode"], r["ttft_p50"]) for r in merged] == [
        (1, "sim", 1.0),
        (2, "sim", 9.0),
        (2, "live", 5.0),
    ]
