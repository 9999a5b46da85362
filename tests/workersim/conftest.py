"""Fixtures: an in-process worker-sim and an official OpenAI client pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openai import AsyncOpenAI

from kvgate.workersim import WorkerHandle, WorkerOptions, running_worker

FAST = WorkerOptions(port=0, profile="fast", kv_blocks=512, block_size=16, seed=7)
"""A worker whose steps take microseconds: answers come back at once."""


@pytest.fixture
async def worker() -> AsyncIterator[WorkerHandle]:
    """A fast worker on a free port, stopped after the test."""
    async with running_worker(FAST) as handle:
        yield handle


@pytest.fixture
async def client(worker: WorkerHandle) -> AsyncIterator[AsyncOpenAI]:
    """The official client, without retries so faults show as they are."""
    async with AsyncOpenAI(base_url=worker.url + "/v1", api_key="unused", max_retries=0) as oai:
        yield oai
