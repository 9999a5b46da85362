"""Misbehaving workers: garbage, half answers, resets, hangs, huge heads; clean client errors."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest

from kvgate.gateway.testing import GatewayHandle
from kvgate.testing import wait_until

from .conftest import fake_fleet, gateway_port
from .fake_worker import FLOOD_EVENTS, FakeWorker

pytestmark = pytest.mark.usefixtures("both_servers")

URL = "/v1/completions"


async def _post(session: aiohttp.ClientSession, url: str, mode: str) -> tuple[int, bytes]:
    body = {"model": "demo", "prompt": f"mode:{mode}"}
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.read()


@pytest.mark.parametrize(
    "mode",
    ["garbage", "huge_head", "reset_head", "reset_body", "hang", "empty_200", "html_200"],
)
async def test_a_broken_answer_is_a_clean_5xx(mode: str, no_tracebacks: object) -> None:
    # One worker, no retries: what the client sees is what this worker did.
    overrides = {"retries": {"count": 0}, "timeouts": {"first_byte_s": 0.5, "total_s": 2.0}}
    async with fake_fleet(1, **overrides) as (gw, fakes), aiohttp.ClientSession() as session:
        status, body = await _post(session, gw.url + URL, mode)
    assert status in (502, 504), body
    error = json.loads(body)["error"]
    assert error["type"] == "server_error"
    assert "127.0.0.1" not in error["message"]  # no worker address reaches the client
    assert str(fakes[0].port) not in error["message"]


async def test_a_worker_dying_mid_stream_ends_the_stream_with_an_error_event() -> None:
    async with fake_fleet(1) as (gw, _), aiohttp.ClientSession() as session:
        body = {"model": "demo", "prompt": "mode:reset_stream", "stream": True}
        async with session.post(gw.url + URL, json=body) as resp:
            assert resp.status == 200
            data = b""
            try:
                async for chunk in resp.content.iter_any():
                    data += chunk
            except aiohttp.ClientPayloadError:
                pass
    events = [e for e in data.split(b"\n\n") if e.strip()]
    assert events[0].startswith(b"data: {")  # what the worker sent is passed on
    last = json.loads(events[-1].removeprefix(b"data: "))
    assert last["error"]["code"] == "stream_broken"


async def test_the_openai_client_raises_on_a_stream_cut_mid_way() -> None:
    import openai

    async with fake_fleet(1) as (gw, _):
        client = openai.AsyncOpenAI(base_url=gw.openai_base, api_key="x", max_retries=0)
        stream = await client.completions.create(
            model="demo", prompt="mode:reset_stream", stream=True
        )
        with pytest.raises(openai.APIError):
            async for _ in stream:
                pass
        await client.close()


async def test_an_event_before_a_framing_error_reaches_the_client() -> None:
    async with fake_fleet(1) as (gw, _), aiohttp.ClientSession() as session:
        body = {"model": "demo", "prompt": "mode:bad_chunk", "stream": True}
        async with session.post(gw.url + URL, json=body) as resp:
            data = b""
            try:
                async for chunk in resp.content.iter_any():
                    data += chunk
            except aiohttp.ClientPayloadError:
                pass
    assert b'"text":"hi"' in data


async def test_a_client_that_stops_reading_a_stream_pauses_the_worker() -> None:
    """Backpressure end to end: the client's buffer fills, the gateway stops reading the
    worker, the worker's writes wait; every byte still arrives once the client reads."""
    async with fake_fleet(1) as (gw, (fake,)):
        body = json.dumps({"model": "demo", "prompt": "mode:flood_stream", "stream": True})
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway_port(gw))
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode())
        )
        total = FLOOD_EVENTS * (64 * 1024 + 8)
        # Nothing is read: the worker must come to a stop far short of the whole stream.
        await wait_until(lambda: fake.flooded > 0, message="the flood started")
        await wait_until(
            lambda: _held_back(fake, gw), message="the worker held back by the gateway"
        )
        assert fake.flooded < total // 2
        received = 0
        while True:
            data = await asyncio.wait_for(reader.read(1 << 20), 10)
            if not data:
                break
            received += len(data)
            if b"data: [DONE]" in data[-64:]:
                break
        writer.close()
        assert fake.flooded == total
        assert received > total  # every event, plus the framing


def _held_back(fake: FakeWorker, gw: GatewayHandle) -> bool:
    """True when the gateway paused reading the worker (its buffer of the stream is full)."""
    (worker,) = list(gw.gateway.pool)
    pool = worker.upstream._pool
    return pool is not None and any(conn._paused for conn in pool._open)
