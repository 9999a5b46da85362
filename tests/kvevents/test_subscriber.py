"""The emulated worker publishes its engine's KV events; the subscriber's index equals
the engine's cache through lost batches, garbage, and restarts on either side."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from kvgate.core.exact_index import ExactIndex
from kvgate.engine.tokenizer import tokenize
from kvgate.kvevents.subscriber import KVEventSubscriber
from kvgate.testing import free_port_pair
from kvgate.waiting import wait_until
from kvgate.workersim import WorkerHandle, WorkerOptions, running_worker
from kvgate.workersim.protocol import Prompt
from kvgate.workersim.runner import start_worker

WORKER = "w1"


def _options(port: int) -> WorkerOptions:
    return WorkerOptions(
        port=0, profile="fast", kv_blocks=48, block_size=16, seed=3, kv_events_port=port
    )


@pytest.fixture
async def events_port() -> int:
    return free_port_pair()


@pytest.fixture
async def worker(events_port: int) -> AsyncIterator[WorkerHandle]:
    async with running_worker(_options(events_port)) as handle:
        yield handle


def _subscriber(port: int, index: ExactIndex) -> KVEventSubscriber:
    return KVEventSubscriber(
        WORKER,
        f"tcp://127.0.0.1:{port}",
        index,
        replay_endpoint=f"tcp://127.0.0.1:{port + 1}",
        replay_timeout_s=2.0,
        idle_probe_s=0.2,
    )


async def _send(handle: WorkerHandle, prompts: list[str]) -> None:
    async with aiohttp.ClientSession() as session:
        for prompt in prompts:
            body = {"model": "demo", "prompt": prompt, "max_tokens": 4}
            async with session.post(handle.url + "/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()


def _prompts(start: int, n: int) -> list[str]:
    # Groups share an opening, so blocks are reused, and 48 blocks force evictions.
    return [
        f"group {i % 3} opening " + "shared words " * 40 + f"question {i} " + "more " * 30
        for i in range(start, start + n)
    ]


async def _agree(index: ExactIndex, handle: WorkerHandle) -> None:
    await wait_until(
        lambda: index.held_keys(WORKER) == handle.engine.cached_blocks(),
        timeout=10,
        message="the index equals the engine's cache",
    )


async def test_index_follows_the_engine_through_evictions(
    worker: WorkerHandle, events_port: int
) -> None:
    index = ExactIndex()
    sub = _subscriber(events_port, index)
    sub.start()
    try:
        await _send(worker, _prompts(0, 12))
        await _agree(index, worker)
        assert worker.engine.stats(0.0).evicted_blocks > 0
        # What a request's own tokens find is what the engine would reuse.
        prompt = _prompts(11, 1)[0]
        tokens = tokenize(prompt)
        held = index.held_tokens(tokens).get(WORKER, 0)
        blocks = worker.worker.engine_request("x", Prompt.of_text(prompt), 4, None).block_hashes
        assert held == worker.engine.cached_prefix_tokens(blocks, len(tokens))
    finally:
        await sub.close()


async def test_lost_batches_and_garbage_are_replayed(
    worker: WorkerHandle, events_port: int
) -> None:
    index = ExactIndex()
    sub = _subscriber(events_port, index)
    sub.start()
    try:
        await _send(worker, _prompts(0, 2))
        await _agree(index, worker)
        app_publisher = worker.kv_publisher
        assert app_publisher is not None
        app_publisher.drop = lambda seq: seq % 10 == 3  # every tenth batch lost
        await _send(worker, _prompts(2, 20))
        await _agree(index, worker)
        assert sub.stats.gaps > 0 and sub.stats.replays > 0
        app_publisher.drop = None
        await sub.receive([b"", b"\x00" * 8])  # two frames
        await sub.receive([b"", b"\x01", b"x"])  # a bad sequence frame
        await sub.receive([b"", (10**6).to_bytes(8, "big"), b"\xc1"])  # ahead, not msgpack
        assert sub.stats.garbage >= 2
        await _send(worker, _prompts(22, 5))
        await _agree(index, worker)
    finally:
        await sub.close()


async def test_a_restarted_subscriber_rebuilds_from_the_replay_buffer(
    worker: WorkerHandle, events_port: int
) -> None:
    await _send(worker, _prompts(0, 10))
    index = ExactIndex()
    sub = _subscriber(events_port, index)
    sub.start()
    try:
        await _send(worker, _prompts(10, 1))  # the first live batch is a gap from 0
        await _agree(index, worker)
    finally:
        await sub.close()
    index.clear(WORKER)  # a new process knows nothing
    again = _subscriber(events_port, index)
    again.start()
    try:
        await _send(worker, _prompts(11, 2))
        await _agree(index, worker)
    finally:
        await again.close()


async def test_a_restarted_worker_is_followed_from_its_new_sequence(events_port: int) -> None:
    index = ExactIndex()
    sub = _subscriber(events_port, index)
    first = await start_worker(_options(events_port))
    sub.start()
    try:
        await _send(first, _prompts(0, 15))
        await _agree(index, first)
        await first.stop()
        second = await start_worker(_options(events_port))
        try:
            await _send(second, _prompts(100, 2))  # its cache starts empty
            await _agree(index, second)
            assert sub.stats.restarts >= 1 or sub.stats.resyncs >= 1
        finally:
            await second.stop()
    finally:
        await sub.close()
