"""The held-out shapes: each generates its requests and is judged in the simulator only."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from kvgate.judge import live
from kvgate.judge.scenarios import HELD_OUT, ISSUE_SHAPES, SCENARIOS, judged
from kvgate.sim.ablation import judge_shapes
from kvgate.workload.traces import TRACE_PREFIX, traces_folder


def _traces_present() -> bool:
    try:
        traces_folder()
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name", list(HELD_OUT))
def test_each_held_out_shape_generates_and_is_flagged_sim_only(name: str) -> None:
    scenario = HELD_OUT[name]
    assert scenario.sim_only and SCENARIOS[name] is scenario
    if scenario.workload.startswith(TRACE_PREFIX) and not _traces_present():
        pytest.skip("shared traces not present")
    first = list(itertools.islice(scenario.source(500).requests(), scenario.requests))
    assert len(first) == scenario.requests
    arrivals = [r.arrival for r in first]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0.0
    assert all(r.prompt_tokens > 0 for r in first)
    again = list(itertools.islice(scenario.source(500).requests(), scenario.requests))
    assert [r.segments for r in again] == [r.segments for r in first]  # seeded


def test_the_tuned_shapes_run_live_and_the_held_out_are_left_out_of_it_and_the_ablation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert not any(s.sim_only for s in ISSUE_SHAPES.values())
    names = [s.name for s in judged()]
    assert set(HELD_OUT) <= set(names)  # the judge's default run includes them
    assert not set(HELD_OUT) & {shape.name for shape in judge_shapes()}

    def no_router(*_: object) -> None:
        raise AssertionError("a sim-only scenario started a live router")

    monkeypatch.setattr(live, "prepare", no_router)
    runs = asyncio.run(live.run_all_live(list(HELD_OUT.values()), [500], tmp_path))
    assert runs == []


def test_the_page_says_which_shapes_are_held_out() -> None:
    from kvgate.judge.protocol import document
    from kvgate.judge.report import section

    shapes = [ISSUE_SHAPES["session-docs"], HELD_OUT["chat-bursty"]]
    page = section([document(shapes, [], [], sim_seeds=[500])], ["benchmarks/judge.py"])
    rows = {line.split(" | ")[0]: line for line in page.splitlines() if line.startswith("| ")}
    assert "*held out:* X-Session-ID chat" in rows["| chat-bursty"]
    assert "held out" not in rows["| session-docs"]
