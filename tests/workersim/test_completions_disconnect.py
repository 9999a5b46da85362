"""A client that goes away mid-answer is aborted in the engine, as vLLM does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from kvgate.testing import wait_until
from kvgate.workersim import WorkerHandle, WorkerOptions, running_worker

from .helpers import sample, scrape

# Real H100 step times at real speed: a 4000-token answer takes ~30 s, so the
# client is sure to leave before it ends.
SLOW = WorkerOptions(port=0, profile="h100-llama3-8b", time_scale=1.0, seed=3)
LONG = {
    "model": SLOW.model,
    "messages": [{"role": "user", "content": "Write a very long essay about KV caches. " * 20}],
    "max_tokens": 4000,
}


@pytest.fixture
async def slow_worker() -> AsyncIterator[WorkerHandle]:
    """A worker at real H100 speed."""
    async with running_worker(SLOW) as handle:
        yield handle


def _engine_idle(worker: WorkerHandle) -> bool:
    stats = worker.engine.stats(worker.worker.driver.now())
    return stats.requests_aborted == 1 and stats.running == 0 and stats.gpu_blocks_in_use == 0


async def test_disconnect_mid_stream_aborts_and_frees_blocks(slow_worker: WorkerHandle) -> None:
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            slow_worker.url + "/v1/chat/completions", json={**LONG, "stream": True}
        )
        assert response.status == 200
        content_chunks = 0
        async for line in response.content:
            if b'"content":"' in line and b'"content":""' not in line:
                content_chunks += 1
                if content_chunks == 2:
                    break
        # While it streams, the engine runs it and vLLM's gauge says so.
        families = await scrape(slow_worker.url)
        assert sample(families["vllm:num_requests_running"], model_name=SLOW.model) == 1
        assert sample(families["vllm:kv_cache_usage_perc"], model_name=SLOW.model) > 0
        response.close()
    await wait_until(lambda: _engine_idle(slow_worker), timeout=5, message="abort in engine")
    families = await scrape(slow_worker.url)
    success = families["vllm:request_success"]
    assert sample(success, "_total", finished_reason="abort", model_name=SLOW.model) == 1
    assert sample(families["kvgate_workersim_aborted_requests"], "_total") == 1


async def test_disconnect_before_the_answer_aborts(slow_worker: WorkerHandle) -> None:
    timeout = aiohttp.ClientTimeout(total=0.3)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        with pytest.raises(asyncio.TimeoutError):
            async with session.post(slow_worker.url + "/v1/chat/completions", json=LONG) as resp:
                await resp.read()
    await wait_until(lambda: _engine_idle(slow_worker), timeout=5, message="abort in engine")
