"""The agent-tools shape, and sessions away on a tool call in the simulator."""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict

from kvgate.bench.payloads import PayloadBuilder
from kvgate.sim.simulation import SimConfig, Simulation
from kvgate.workload.payloads import PARENT_HEADER
from kvgate.workload.request import SimRequest
from kvgate.workload.synthetic import build_workload


def _take(n: int, seed: int = 3, spec: str = "agent-tools") -> list[SimRequest]:
    return list(itertools.islice(build_workload(spec, seed).requests(), n))


def test_agents_loop_on_tool_calls_behind_one_preamble_with_subagents() -> None:
    requests = _take(3000)
    by_session: dict[str, list[SimRequest]] = defaultdict(list)
    for r in requests:
        assert r.session_id is not None and r.segments[0] == (0, 4096)
        by_session[r.session_id].append(r)
    finished = [turns for turns in by_session.values() if not turns[-1].tool_call]
    parents = [t for t in finished if t[0].parent_session is None]
    subagents = [t for t in finished if t[0].parent_session is not None]
    assert parents and subagents
    assert all(10 <= len(t) <= 40 for t in parents)
    assert all(3 <= len(t) <= 8 for t in subagents)
    for turns in finished:
        # Every turn but the last calls a tool; every turn but the first returns from one.
        assert [t.tool_call for t in turns] == [True] * (len(turns) - 1) + [False]
        assert [t.returning for t in turns] == [False] + [True] * (len(turns) - 1)
        for earlier, later in itertools.pairwise(turns):
            assert later.segments[: len(earlier.segments)] == earlier.segments
    for turns in subagents:
        parent = by_session[turns[0].parent_session or ""][0]
        assert turns[0].segments[:2] == parent.segments[:2]  # the preamble and the task
    # Tool pauses are heavy-tailed: the slowest are many times the median.
    gaps = sorted(
        later.arrival - earlier.arrival
        for turns in by_session.values()
        for earlier, later in itertools.pairwise(turns)
    )
    assert gaps[int(0.99 * len(gaps))] > 10 * gaps[len(gaps) // 2]


def test_an_agents_turns_carry_its_tools_and_a_subagent_names_its_parent() -> None:
    builder = PayloadBuilder("m")
    requests = _take(400)
    calls = [builder.payload(r) for r in requests if r.tool_call]
    assert all(p.body["tool_choice"] == "required" and p.body["tools"] for p in calls)
    sub = next(r for r in requests if r.parent_session is not None)
    assert builder.payload(sub).headers[PARENT_HEADER] == sub.parent_session


def test_the_simulator_books_tool_calls_and_reports_returning_turns() -> None:
    config = SimConfig(
        workers=2, kv_blocks=(600,), block_size=16, seed=1, max_requests=150,
        client_concurrency=32, cpu_offload_blocks=4000,
    )  # fmt: skip
    workload = build_workload("agent-tools:rate=10", 1)
    run = Simulation(config, workload.requests(), "default", {}).run()
    summary = run.summary
    assert summary["returns"] > 100
    assert summary["ttft_return_p99"] >= summary["ttft_return_p50"] > 0
    peer = dataclasses.replace(config, pressure=None)
    plain = Simulation(peer, workload.requests(), "default", {}).run()
    assert plain.summary["returns"] == summary["returns"]
