"""``bench.misses``: a live run's cache misses split by the simulator's causes."""

from __future__ import annotations

import contextlib

import pytest

from kvgate.bench import run_bench
from kvgate.bench.client import Answer
from kvgate.bench.misses import live_misses
from kvgate.bench.replay import Outcome
from kvgate.gateway.testing import running_gateway
from kvgate.workersim import WorkerOptions, running_worker
from kvgate.workload.request import SimRequest
from kvgate.workload.synthetic import build_workload

BLOCK = 16


def turn(rid: str, segments: tuple[tuple[int, int], ...], reply: int | None) -> SimRequest:
    return SimRequest.of(
        0.0, rid, segments, 8, reply=None if reply is None else (reply, 32), conversation="c"
    )


def answered(
    request: SimRequest, worker: str | None, cached: int | None, sent: float, ok: bool = True
) -> Outcome:
    answer = Answer(sent=sent, finished=sent + 1.0, status=200 if ok else 429)
    answer.prompt_tokens, answer.cached_tokens, answer.worker = (
        request.prompt_tokens,
        cached,
        worker,
    )
    return Outcome(request.request_id, None, 0.0, sent, answer)


# One conversation: an opening (256 tokens) and two later turns, each re-sending the
# earlier prompt and reply (32 tokens) and adding 64.
FIRST = turn("t1", ((1, 256),), reply=101)
SECOND = turn("t2", ((1, 256), (101, 32), (2, 64)), reply=102)
THIRD = turn("t3", ((1, 256), (101, 32), (2, 64), (102, 32), (3, 64)), reply=None)


def test_a_turn_at_home_that_missed_counts_as_evicted_and_one_moved_as_moved() -> None:
    outcomes = [
        answered(FIRST, "w-a", 0, sent=0.0),
        answered(SECOND, "w-a", 256, sent=2.0),  # home, but lost its last turn: evicted
        answered(THIRD, "w-b", 0, sent=4.0),  # moved: all it re-sends was recomputed
    ]
    split = live_misses([FIRST, SECOND, THIRD], outcomes, BLOCK)
    assert split is not None and split["split"] == 3
    tokens = split["tokens"]
    total = FIRST.prompt_tokens + SECOND.prompt_tokens + THIRD.prompt_tokens
    assert split["prompt_tokens"] == total
    # The first turn's 256 and every turn's new text are new; the second turn's 32-token
    # reply block was seen (it straddles prompt and reply) and missed at home.
    assert tokens["turn_home"] > 0 and tokens["turn_moved"] > 0
    assert tokens["turn_early"] == tokens["shared"] == 0
    cached = 256
    assert sum(tokens.values()) == total - cached
    # The moved turn re-sent the second turn's prompt (352 tokens) and its reply (32).
    assert tokens["turn_moved"] == 352 + 32


def test_requests_without_a_worker_or_usage_are_left_out() -> None:
    outcomes = [
        answered(FIRST, "w-a", 0, sent=0.0),
        answered(SECOND, None, 256, sent=2.0),  # a router that names no worker
        answered(THIRD, "w-a", None, sent=4.0),  # no cached_tokens report
    ]
    split = live_misses([FIRST, SECOND, THIRD], outcomes, BLOCK)
    assert split is not None and split["split"] == 1
    assert live_misses([FIRST], [answered(FIRST, "w-a", 0, 0.0, ok=False)], BLOCK) is None


async def test_a_live_run_through_the_gateway_splits_every_miss() -> None:
    """Round robin moves most turns: the split says so, and adds up to the hit rate."""
    chat = "chat:rate=50,think_s=0.05,turns_mean=4,system_tokens=256,user_tokens=40,output_tokens=8"
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for seed in range(2):
            options = WorkerOptions(
                port=0, profile="fast", kv_blocks=4096, block_size=BLOCK, seed=seed
            )
            urls.append((await stack.enter_async_context(running_worker(options))).url)
        config = {
            "listen": {"host": "127.0.0.1", "port": 0},
            "workers": [{"url": url, "model": "demo"} for url in urls],
            "policy": {"name": "round_robin"},
        }
        gateway = await stack.enter_async_context(running_gateway(config))
        results = await run_bench(
            gateway.url, build_workload(chat, 5), requests=40, model="demo", misses=True
        )
    run = results["policies"]["live"]
    split = run["misses"]
    assert split["split"] == run["finished"] == 40
    assert 100.0 - sum(split["points"].values()) == pytest.approx(100.0 * run["hit_rate"], abs=0.01)
    assert split["tokens"]["turn_moved"] > 0  # round robin alternates a session's workers
    assert split["tokens"]["new"] > 0


async def test_the_emulated_worker_names_itself_so_any_router_can_be_split() -> None:
    """No gateway, no ``X-Kvgate-Worker``: the worker's own ``kvgate_timing.worker`` names
    it, so a peer router's run splits too. One worker with room for all: turns hit at home."""
    chat = "chat:rate=50,think_s=0.05,turns_mean=4,system_tokens=256,user_tokens=40,output_tokens=8"
    options = WorkerOptions(port=0, profile="fast", kv_blocks=4096, block_size=BLOCK, seed=1)
    async with running_worker(options) as worker:
        results = await run_bench(worker.url, build_workload(chat, 5), requests=30, misses=True)
    split = results["policies"]["live"]["misses"]
    assert split["split"] == 30
    assert split["tokens"]["turn_moved"] == 0  # one worker: nothing can move
    assert split["tokens"]["new"] > 0
