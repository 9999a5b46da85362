"""Misbehaving workers: garbage, half answers, resets, hangs, huge heads; clean client errors."""

from __future__ import annotations

import json

import aiohttp
import pytest

from .conftest import fake_fleet

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
