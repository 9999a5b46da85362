"""Streams are relayed event by event: nothing waits in the gateway for more bytes.

The worker here sends event k+1 only after the client has read event k through
the gateway (lockstep). A gateway that held an event back for more bytes would
stall the exchange, and the bounded waits below would fail the test instead of
hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from kvgate.gateway.testing import running_gateway
from kvgate.testing import wait_until

pytestmark = pytest.mark.usefixtures("both_servers")

EVENTS = 8
STEP_S = 10.0
"""Bound on each lockstep wait: generous on a loaded machine, never a sleep."""


@contextlib.asynccontextmanager
async def _lockstep_worker(read: list[asyncio.Event]) -> AsyncIterator[str]:
    """A worker whose stream sends event k+1 once ``read[k]`` is set by the client."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "demo", "object": "model"}]})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for k in range(EVENTS):
            await response.write(b'data: {"choices":[{"index":0,"text":"t%d"}]}\n\n' % k)
            await asyncio.wait_for(read[k].wait(), STEP_S)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_each_event_reaches_the_client_before_the_worker_sends_the_next() -> None:
    read = [asyncio.Event() for _ in range(EVENTS)]
    async with _lockstep_worker(read) as url:
        config = {"workers": [{"url": url}], "health": {"interval_s": 0.1, "timeout_s": 2.0}}
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await wait_until(gw.gateway.ready, message="the worker is up")
            body = {"model": "demo", "prompt": "hi", "stream": True}
            async with session.post(gw.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                seen = b""
                for k in range(EVENTS):
                    while b"t%d" % k not in seen:
                        line = await asyncio.wait_for(resp.content.readline(), STEP_S)
                        assert line, f"the stream ended before event {k}"
                        seen += line
                    read[k].set()  # only now may the worker send the next event
                rest = await asyncio.wait_for(resp.content.read(), STEP_S)
    assert b"[DONE]" in rest
