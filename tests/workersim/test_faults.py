"""Fault injection: set by options and at run time through ``/admin/faults``."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from kvgate.engine import Engine
from kvgate.testing import wait_until
from kvgate.workersim import WorkerHandle, WorkerOptions, running_worker

from .conftest import FAST
from .helpers import assert_openai_error, get_json, post

CHAT = {"model": FAST.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def _set(worker: WorkerHandle, **faults: object) -> dict[str, object]:
    status, answer = await post(worker.url + "/admin/faults", faults)
    assert status == 200, answer
    assert isinstance(answer, dict)
    return answer


async def test_faults_read_back_and_update_partially(worker: WorkerHandle) -> None:
    status, initial = await get_json(worker.url + "/admin/faults")
    assert status == 200
    assert initial["error_rate"] == 0.0 and initial["hang"] is False
    after = await _set(worker, error_rate=0.25)
    assert after == {**initial, "error_rate": 0.25}
    after = await _set(worker, close_mid_stream_after=2)
    assert after == {**initial, "error_rate": 0.25, "close_mid_stream_after": 2}
    status, answer = await post(worker.url + "/admin/faults", {"error_rate": 2})
    assert status == 400
    assert assert_openai_error(answer)["param"] == "error_rate"
    status, answer = await post(worker.url + "/admin/faults", {"explode": True})
    assert status == 400


async def test_error_rate_one_fails_every_request(
    worker: WorkerHandle, client: AsyncOpenAI
) -> None:
    await _set(worker, error_rate=1.0)
    with pytest.raises(openai.InternalServerError) as caught:
        await client.chat.completions.create(
            model=FAST.model, messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
    assert caught.value.status_code == 500
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["type"] == "internal_server_error"
    body = {"model": FAST.model, "prompt": "x"}
    status, answer = await post(worker.url + "/v1/completions", body)
    assert status == 500
    assert_openai_error(answer, "internal_server_error")


async def _failures(options: WorkerOptions, n: int) -> list[bool]:
    async with running_worker(options) as handle:
        results = []
        for _ in range(n):
            status, _ = await post(handle.url + "/v1/chat/completions", CHAT)
            results.append(status == 500)
        return results


async def test_error_rate_is_seeded() -> None:
    options = FAST.model_copy(update={"error_rate": 0.5})
    first = await _failures(options, 24)
    assert 0 < sum(first) < 24
    assert await _failures(options, 24) == first
    other_seed = await _failures(options.model_copy(update={"seed": FAST.seed + 1}), 24)
    assert other_seed != first


async def test_extra_latency_delays_the_first_byte(worker: WorkerHandle) -> None:
    await _set(worker, extra_latency_ms=150)
    started = time.monotonic()
    status, _ = await post(worker.url + "/v1/chat/completions", CHAT)
    assert status == 200
    assert time.monotonic() - started >= 0.15


async def test_hang_accepts_and_never_answers(worker: WorkerHandle) -> None:
    await _set(worker, hang=True)
    timeout = aiohttp.ClientTimeout(total=0.3)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        with pytest.raises(asyncio.TimeoutError):
            async with session.post(worker.url + "/v1/chat/completions", json=CHAT) as response:
                await response.read()
    assert worker.worker.faults.injected["hang"] == 1
    assert not worker.engine.has_work()
    await _set(worker, hang=False)
    status, _ = await post(worker.url + "/v1/chat/completions", CHAT)
    assert status == 200


async def test_close_mid_stream_drops_after_n_chunks(worker: WorkerHandle) -> None:
    await _set(worker, close_mid_stream_after=2)
    events: list[bytes] = []
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientPayloadError):
            async with session.post(
                worker.url + "/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 50}
            ) as response:
                assert response.status == 200
                async for line in response.content:
                    if line.startswith(b"data: "):
                        events.append(line)
    assert len(events) == 2
    assert b"[DONE]" not in b"".join(events)
    # The dropped request was aborted in the engine, its blocks freed.
    await wait_until(lambda: worker.engine.stats(0.0).requests_aborted == 1, timeout=5)
    assert not worker.engine.has_work()


async def test_refuse_connections_closes_without_answer(worker: WorkerHandle) -> None:
    await _set(worker, refuse_connections=True)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            async with session.post(worker.url + "/v1/chat/completions", json=CHAT) as response:
                await response.read()
        with pytest.raises(aiohttp.ClientConnectionError):
            async with session.get(worker.url + "/health") as response:
                await response.read()
    # The admin API stays reachable so the fault can be cleared.
    await _set(worker, refuse_connections=False)
    status, _ = await post(worker.url + "/v1/chat/completions", CHAT)
    assert status == 200
    # (aiohttp may retry an idempotent GET once on a fresh connection.)
    assert worker.worker.faults.injected["refuse_connection"] >= 2


async def test_faults_from_options() -> None:
    options = FAST.model_copy(update={"error_rate": 1.0, "extra_latency_ms": 5.0})
    async with running_worker(options) as handle:
        status, faults = await get_json(handle.url + "/admin/faults")
        assert status == 200
        assert faults["error_rate"] == 1.0 and faults["extra_latency_ms"] == 5.0
        status, answer = await post(handle.url + "/v1/chat/completions", CHAT)
        assert status == 500
        assert_openai_error(answer)


async def test_speed_slows_the_engine_from_the_moment_it_is_set(worker: WorkerHandle) -> None:
    assert worker.engine.speed == 1.0
    after = await _set(worker, speed=0.5)
    assert after["speed"] == 0.5
    assert worker.engine.speed == 0.5
    assert worker.engine.alone_ttft(2048, 0) == pytest.approx(
        2 * Engine(worker.engine.config).alone_ttft(2048, 0)
    )
    status, _ = await post(worker.url + "/admin/faults", {"speed": 0})
    assert status == 400
    assert worker.engine.speed == 0.5
    async with running_worker(FAST.model_copy(update={"speed": 0.25})) as slow:
        assert slow.engine.speed == 0.25
