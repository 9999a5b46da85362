"""``run_bench`` and the replay against in-process emulated workers (no gateway)."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from kvgate.bench import run_bench
from kvgate.bench.client import Answer, BenchClient
from kvgate.bench.payloads import PayloadBuilder
from kvgate.bench.replay import Outcome, Replay
from kvgate.bench.report import summarize
from kvgate.workersim import WorkerHandle, WorkerOptions, running_worker
from kvgate.workload.synthetic import build_workload
from kvgate.workload.traces import open_trace

# A quick chat workload: sessions with a shared system prompt, turns close together.
CHAT = "chat:rate=200,think_s=0.02,turns_mean=4,system_tokens=256,user_tokens=40,output_tokens=8"


def fast_worker(**overrides: object) -> WorkerOptions:
    """A worker whose steps take microseconds, with room for every prompt."""
    options: dict[str, object] = {
        "port": 0,
        "profile": "fast",
        "kv_blocks": 4096,
        "block_size": 16,
        "seed": 1,
    }
    options.update(overrides)
    return WorkerOptions.model_validate(options)


@pytest.fixture
async def worker() -> AsyncIterator[WorkerHandle]:
    async with running_worker(fast_worker()) as handle:
        yield handle


async def test_every_request_answered_with_cache_hits_and_sim_shaped_results(
    worker: WorkerHandle,
) -> None:
    workload = build_workload(CHAT, seed=4)
    results = await run_bench(worker.url, workload, requests=40, concurrency=8)

    run = results["policies"]["live"]
    assert run["requests"] == 40
    assert run["finished"] == 40
    assert run["errors"] == 0 and run["shed"] == 0
    assert run["missing_usage"] == 0
    assert run["prompt_tokens"] > 0
    assert 0 < run["hit_rate"] <= 1
    assert run["hit_rate"] == round(run["cached_tokens"] / run["prompt_tokens"], 6)
    assert 0 < results["bound_hit_rate"] <= 1
    assert results["bound"]["requests"] == 40
    assert run["hit_rate_of_bound"] == pytest.approx(
        run["hit_rate"] / results["bound_hit_rate"], 1e-4
    )
    for key in ("ttft_p50", "ttft_p99", "throughput", "e2e_p50", "load_cv"):
        assert key in run
    assert 0 < run["ttft_p50"] <= run["ttft_p99"]
    assert results["workload"]["name"] == "chat"
    assert results["config"]["model"] == "demo"  # learned from /v1/models
    # No gateway in front: every answer counts for the one unnamed target.
    assert run["served"] == {"target": 40}


async def test_fleet_kv_blocks_adds_the_capacity_aware_reference(worker: WorkerHandle) -> None:
    workload = build_workload(CHAT, seed=4)
    results = await run_bench(worker.url, workload, requests=30, fleet_kv_blocks=40)
    assert results["reference"]["capacity_blocks"] == 40
    # 40 blocks hold the shared system prompt and a turn or two: some reuse, less than all.
    assert 0 < results["reference_hit_rate"] < results["bound_hit_rate"]
    run = results["policies"]["live"]
    assert run["hit_rate_of_reference"] == pytest.approx(
        run["hit_rate"] / results["reference_hit_rate"], 1e-4
    )
    without = await run_bench(worker.url, workload, requests=10)
    assert (
        without["reference"] is None and "hit_rate_of_reference" not in without["policies"]["live"]
    )


async def test_prompts_are_deterministic_across_two_workers() -> None:
    workload = build_workload(CHAT, seed=9)
    totals = []
    for seed in (1, 2):
        async with running_worker(fast_worker(seed=seed)) as handle:
            results = await run_bench(handle.url, workload, requests=24, model="demo")
        totals.append(results["policies"]["live"]["prompt_tokens"])
    assert totals[0] == totals[1] > 0


async def test_session_turns_go_in_order_never_before_their_arrival(worker: WorkerHandle) -> None:
    # No think time: every next turn is scheduled before the previous one can finish,
    # so only the replay's ordering keeps them apart.
    workload = build_workload(
        "chat:rate=100,think_s=0,turns_mean=5,system_tokens=128,user_tokens=30,output_tokens=20",
        seed=3,
    )
    async with BenchClient(worker.url, concurrency=16) as client:
        replay = Replay(client, PayloadBuilder("demo"))
        outcomes = await replay.run(itertools.islice(workload.requests(), 30))

    sessions: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        assert outcome.answer.ok, outcome.answer.error
        assert outcome.answer.sent >= outcome.arrival
        assert outcome.session_id is not None
        sessions[outcome.session_id].append(outcome)
    multi = [turns for turns in sessions.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        turns.sort(key=lambda o: int(o.request_id[1:]))
        for earlier, later in itertools.pairwise(turns):
            assert later.answer.sent >= earlier.answer.finished
            # The later turn re-sends the earlier one's prompt and its answer.
            assert (later.answer.prompt_tokens or 0) > (earlier.answer.prompt_tokens or 0)
            assert (later.answer.cached_tokens or 0) > 0


async def test_failed_requests_are_counted_not_raised() -> None:
    async with running_worker(fast_worker(error_rate=1.0)) as handle:
        results = await run_bench(
            handle.url, build_workload(CHAT, seed=1), requests=10, model="demo"
        )
    run = results["policies"]["live"]
    assert run["requests"] == 10
    assert run["finished"] == 0
    assert run["errors"] == 10
    assert run["error_kinds"] == {"http_500": 10}


async def _too_busy(request: web.Request) -> web.Response:
    body = {"error": {"message": "overloaded", "type": "rate_limit", "code": "overloaded"}}
    return web.json_response(body, status=429, headers={"Retry-After": "1"})


async def test_429_answers_count_as_sheds_and_headers_are_read() -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _too_busy)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    try:
        results = await run_bench(
            f"http://127.0.0.1:{port}/v1", build_workload(CHAT), requests=6, model="m"
        )
    finally:
        await runner.cleanup()
    run = results["policies"]["live"]
    assert run["shed"] == 6
    assert run["sheds"] == {"429": 6}
    assert run["errors"] == 0
    assert run["finished"] == 0


def _outcome(n: int, worker: str | None, prompt: int, cached: int, *, status: int = 200) -> Outcome:
    answer = Answer(
        sent=n * 1.0,
        finished=n * 1.0 + 0.5,
        first_token=n * 1.0 + 0.1,
        status=status,
        error=None if status == 200 else f"HTTP {status}: x",
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=4,
        worker=worker,
        reason="affinity" if worker else None,
    )
    return Outcome(f"r{n}", None, n * 1.0, n * 1.0, answer)


def test_summary_sums_tokens_scales_times_and_counts_idle_workers() -> None:
    outcomes = [
        _outcome(0, "w1", 100, 0),
        _outcome(1, "w1", 200, 150),
        _outcome(2, "w2", 100, 50),
        _outcome(3, "w2", 100, 0, status=503),
    ]
    summary = summarize(outcomes, time_scale=10.0, workers=["w0", "w1", "w2"])
    assert summary["served"] == {"w0": 0, "w1": 2, "w2": 1}
    assert summary["hit_rate"] == round(200 / 400, 6)
    assert summary["ttft_p50"] == pytest.approx(1.0)  # 0.1 s real x 10
    assert summary["e2e_p99"] == pytest.approx(5.0)
    assert summary["errors"] == 1 and summary["error_kinds"] == {"http_503": 1}
    assert summary["reasons"] == {"affinity": 4}
    assert summary["load_max_over_mean"] == pytest.approx(2.0)
    assert "ttft_floor_p99" not in summary  # the fleet's engine model was not given


def test_summary_takes_the_ttft_floor_of_each_answered_request() -> None:
    outcomes = [
        _outcome(0, "w1", 100, 0),
        _outcome(1, "w1", 200, 150),
        _outcome(2, "w2", 100, 50),
        _outcome(3, "w2", 900, 0, status=503),  # not answered: no floor
    ]
    seen: list[tuple[int, int]] = []

    def floor(prompt: int, cached: int) -> float:
        seen.append((prompt, cached))
        return (prompt - cached) / 1000

    summary = summarize(outcomes, ttft_floor=floor)
    assert seen == [(100, 0), (200, 150), (100, 50)]
    assert summary["ttft_floor_p99"] == pytest.approx(float(np.percentile([0.1, 0.05, 0.05], 99)))


async def test_a_mooncake_trace_replays_as_completions_sharing_prefixes(
    worker: WorkerHandle, tmp_path: Path
) -> None:
    # Four requests sharing their first two 512-token blocks, 20 ms apart.
    lines = [
        {"timestamp": 20 * i, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 10 + i]}
        for i in range(4)
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    results = await run_bench(worker.url, open_trace(path), requests=None, model="demo")
    run = results["policies"]["live"]
    assert run["finished"] == run["requests"] == 4
    assert run["hit_rate"] > 0
    assert results["workload"]["name"] == "mooncake"


async def test_worker_reported_timing_is_summarised_beside_client_timing() -> None:
    # A realistic profile at time scale 10: the engine's own TTFT (model time) is
    # reported next to the client's; the client sees at least what the engine spent.
    options = fast_worker(profile="h100-llama3-8b", time_scale=10.0, kv_blocks=4096)
    async with running_worker(options) as handle:
        results = await run_bench(
            handle.url, build_workload(CHAT, seed=5), requests=24, time_scale=10.0
        )
    run = results["policies"]["live"]
    assert run["finished"] == 24
    assert 0 < run["worker_ttft_p50"] <= run["worker_ttft_p99"]
    assert run["worker_ttft_p50"] <= run["ttft_p50"]


def test_summary_says_how_late_the_client_sent_behind_the_arrivals() -> None:
    # A client that falls behind sends in bursts: another workload than the one replayed.
    outcomes = [_outcome(n, "w1", 100, 0) for n in range(10)]
    for n, outcome in enumerate(outcomes):
        outcome.answer.sent += 0.1 * n  # sent 0 .. 0.9 s after its arrival
    summary = summarize(outcomes, time_scale=5.0)
    assert summary["send_late_p50"] == pytest.approx(2.25)  # 0.45 s real x 5
    assert summary["send_late_p90"] == pytest.approx(4.05)
    on_time = summarize([_outcome(n, "w1", 100, 0) for n in range(3)])
    assert on_time["send_late_p50"] == on_time["send_late_p90"] == 0.0
