"""Starting, stopping and killing in-process workers."""

from __future__ import annotations

import aiohttp
import pytest

from kvgate.testing import free_port
from kvgate.workersim import WorkerOptions, running_worker, start_worker

from .test_completions_disconnect import LONG, SLOW


async def test_given_port_and_url() -> None:
    port = free_port()
    async with running_worker(WorkerOptions(port=port, profile="fast")) as worker:
        assert worker.url == f"http://127.0.0.1:{port}"
        assert worker.options.port == port
        async with aiohttp.ClientSession() as session, session.get(worker.url + "/health") as r:
            assert r.status == 200
    assert worker.stopped


async def test_kill_resets_open_streams_and_refuses_new_connections() -> None:
    worker = await start_worker(SLOW)
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            worker.url + "/v1/chat/completions", json={**LONG, "stream": True}
        )
        assert response.status == 200
        await response.content.readline()  # the stream has started
        await worker.kill()
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
        with pytest.raises(aiohttp.ClientConnectionError):
            async with session.get(worker.url + "/health") as again:
                await again.read()
    assert not worker.worker.driver.running
    await worker.stop()  # idempotent after kill


async def test_port_is_reusable_after_stop() -> None:
    port = free_port()
    for _ in range(2):
        async with (
            running_worker(WorkerOptions(port=port, profile="fast")) as worker,
            aiohttp.ClientSession() as session,
            session.get(worker.url + "/health") as r,
        ):
            assert r.status == 200
