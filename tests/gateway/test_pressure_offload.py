"""At the worker: a session whose KV was offloaded comes back faster than one recomputed.

This is what the pressure driver's offload call buys: a session moved away
from a pressured worker and later back finds its blocks in the CPU tier.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from kvgate.workersim import WorkerOptions, running_worker
from kvgate.workersim.runner import WorkerHandle

PROMPT = " ".join(f"word{i}" for i in range(1500))


async def turn(session: aiohttp.ClientSession, worker: WorkerHandle) -> tuple[int, float]:
    """One turn of session ``s``: (cached tokens, model seconds to first token)."""
    before = worker.engine.stats(0.0).ttft.sum
    body = {"model": "demo", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
    headers = {"X-Session-ID": "s"}
    async with session.post(
        f"{worker.url}/v1/chat/completions", json=body, headers=headers
    ) as resp:
        assert resp.status == 200
        usage = (await resp.json())["usage"]
    cached = int(usage["prompt_tokens_details"]["cached_tokens"])
    return cached, worker.engine.stats(0.0).ttft.sum - before


async def offload(session: aiohttp.ClientSession, worker: WorkerHandle) -> dict[str, Any]:
    async with session.post(f"{worker.url}/kv/offload", json={"session_ids": ["s"]}) as resp:
        assert resp.status == 200
        result: dict[str, Any] = await resp.json()
        return result


async def returning_turn(cpu_blocks: int) -> tuple[dict[str, Any], int, float, float]:
    """Serve a turn, offload the session, serve it again: (offload answer, cached, ttfts)."""
    options = WorkerOptions(
        port=0, profile="h100-llama3-8b", time_scale=20.0, cpu_offload_blocks=cpu_blocks
    )
    async with running_worker(options) as worker, aiohttp.ClientSession() as session:
        _, cold = await turn(session, worker)
        answer = await offload(session, worker)
        cached, warm = await turn(session, worker)
    return answer, cached, cold, warm


async def test_an_offloaded_session_returns_faster_than_it_is_recomputed() -> None:
    tiered, tier_cached, tier_cold, from_tier = await returning_turn(cpu_blocks=4096)
    dropped, none_cached, none_cold, recomputed = await returning_turn(cpu_blocks=0)
    # The same offload request: one worker keeps the blocks in CPU memory, one drops them.
    assert tiered["offloaded"] > 0 and tiered["dropped"] == 0
    assert dropped["offloaded"] == 0 and dropped["dropped"] > 0
    # Back on the tiered worker, the prompt is served from the offload tier ...
    assert tier_cached >= 1400
    assert none_cached == 0
    # ... and its first token comes several times sooner than recomputing it.
    assert recomputed > 3 * from_tier
    assert abs(tier_cold - none_cold) < 0.2 * none_cold  # the first turns were alike
