"""Emulated workers whose KV cache a test can fill to a chosen level, and a gateway over them.

A worker's KV usage counts blocks held by running requests, so a test fills it
by sending one long "holder" request straight to the worker (not through the
gateway): a token-id prompt of an exact size whose decode is slow enough at the
chosen time scale to hold that level for seconds. Cancelling the holder frees
its blocks (the worker aborts it), which is how a test lets a worker fall back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from kvgate.core.fleet import Pressure
from kvgate.gateway.testing import GatewayHandle
from kvgate.tasks import cancel_and_wait
from kvgate.testing import wait_until
from kvgate.workersim.runner import WorkerHandle

from .conftest import gateway_config, worker_fleet

KV_BLOCKS = 400
BLOCK_SIZE = 16
CAPACITY = KV_BLOCKS * BLOCK_SIZE
# Slow enough that a holder's usage grows ~1%/s; prefill of a full cache takes ~1 s.
WORKER = {
    "profile": "h100-llama3-8b",
    "time_scale": 0.5,
    "kv_blocks": KV_BLOCKS,
    "block_size": BLOCK_SIZE,
    "cpu_offload_blocks": KV_BLOCKS,
}


def pressure_config(fleet: list[WorkerHandle], **overrides: Any) -> dict[str, Any]:
    """A gateway config with a 50 ms scrape interval over ``fleet``."""
    config = gateway_config(fleet, **overrides)
    config["health"] = {"interval_s": 0.05, "timeout_s": 1.0}
    return config


@contextlib.asynccontextmanager
async def pressure_fleet(count: int) -> AsyncIterator[list[WorkerHandle]]:
    """``count`` workers with a small KV cache and an offload tier."""
    async with worker_fleet(count, **WORKER) as handles:
        yield handles


@contextlib.asynccontextmanager
async def holding(
    session: aiohttp.ClientSession, worker: WorkerHandle, usage: float, max_tokens: int = 300
) -> AsyncIterator[asyncio.Task[int]]:
    """Hold ``worker``'s KV usage at about ``usage`` (rising ~1%/s) for the block's duration."""
    prompt_tokens = round(usage * CAPACITY)
    body = {
        "model": "demo",
        "prompt": [7 + (i % 1000) for i in range(prompt_tokens)],
        "max_tokens": max_tokens,
    }

    async def send() -> int:
        async with session.post(f"{worker.url}/v1/completions", json=body) as resp:
            await resp.read()
            return resp.status

    task = asyncio.create_task(send())
    try:
        yield task
    finally:
        await cancel_and_wait(task)


async def wait_pressure(
    gw: GatewayHandle, worker: WorkerHandle, level: Pressure, limit_s: float = 10.0
) -> None:
    """Wait until the gateway sees ``worker`` at ``level``."""
    state = gw.gateway.pool.get(worker.url)
    assert state is not None
    await wait_until(
        lambda: state.pressure is level, timeout=limit_s, message=f"{worker.url} {level}"
    )


async def chat(
    session: aiohttp.ClientSession,
    gw: GatewayHandle,
    session_id: str | None,
    text: str = "hello there, how are you",
    priority: str | None = None,
) -> tuple[int, str, str]:
    """One small chat request through the gateway: (status, worker, route reason)."""
    headers = {}
    if session_id is not None:
        headers["X-Session-ID"] = session_id
    if priority is not None:
        headers["X-Priority"] = priority
    body = {"model": "demo", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    async with session.post(
        gw.openai_base + "/chat/completions", json=body, headers=headers
    ) as resp:
        await resp.read()
        return (
            resp.status,
            resp.headers.get("X-Kvgate-Worker", ""),
            resp.headers.get("X-Kvgate-Route-Reason", ""),
        )


def metric(gw: GatewayHandle, line_start: str) -> float:
    """The value of the gateway metric sample whose line starts with ``line_start`` (0 if none)."""
    for line in gw.gateway.metrics.render().decode().splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
