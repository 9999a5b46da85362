"""Fixtures for gateway tests: emulated workers and a gateway in front of them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kvgate.gateway.testing import GatewayHandle
from kvgate.testing import wait_until
from kvgate.workersim import WorkerOptions, running_worker
from kvgate.workersim.runner import WorkerHandle

FAST = {"profile": "fast", "time_scale": 50.0}


def gateway_config(fleet: list[WorkerHandle], /, **overrides: Any) -> dict[str, Any]:
    """A test gateway config over ``fleet`` with quick health checks."""
    config: dict[str, Any] = {
        "workers": [{"url": w.url} for w in fleet],
        "expose_worker_urls": True,  # answers are attributed to worker URLs
        # A generous probe timeout: a worker whose first probe times out (a busy
        # machine stalling this process) starts down, and tests expect it up.
        "health": {"interval_s": 0.1, "timeout_s": 2.0},
        "retries": {"backoff_base_s": 0.0, "backoff_max_s": 0.0},
    }
    config.update(overrides)
    return config


@contextlib.asynccontextmanager
async def worker_fleet(count: int, **options: Any) -> AsyncIterator[list[WorkerHandle]]:
    """``count`` emulated workers (fast profile) for the block's duration."""
    async with contextlib.AsyncExitStack() as stack:
        handles = []
        for i in range(count):
            opts = WorkerOptions(port=0, seed=i, **{**FAST, **options})
            handles.append(await stack.enter_async_context(running_worker(opts)))
        yield handles


@pytest.fixture
async def workers() -> AsyncIterator[list[WorkerHandle]]:
    """Two emulated workers serving model ``demo``."""
    async with worker_fleet(2) as handles:
        yield handles


async def every_worker_up(gw: GatewayHandle) -> None:
    """Wait until the gateway routes to every worker.

    A worker whose first probe failed starts down and needs ``rise`` passing
    probes: a test that needs a given worker from its first request waits here.
    """
    await wait_until(
        lambda: all(w.probe_ok and not w.ejected for w in gw.gateway.pool),
        message="every worker up",
    )


async def set_faults(worker: WorkerHandle, **faults: Any) -> None:
    """Change a worker's injected faults through its admin endpoint."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{worker.url}/admin/faults", json=faults) as resp,
    ):
        assert resp.status == 200, await resp.text()
