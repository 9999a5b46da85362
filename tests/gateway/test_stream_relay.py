"""Streams are relayed event by event: nothing waits in the gateway for more bytes.

The worker here sends event k+1 only after the client has read event k through
the gateway (lockstep). A gateway that held an event back for more bytes would
stall the exchange, and the bounded waits below would fail the test instead of
hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from kvgate.core.features import RequestFeatures
from kvgate.core.policies.round_robin import RoundRobin
from kvgate.core.speed import Observation
from kvgate.gateway.dataplane.usage import opening_only
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.gateway.upstream import http1
from kvgate.testing import wait_until
from kvgate.types import Seconds, WorkerId

pytestmark = pytest.mark.usefixtures("both_servers")

EVENTS = 8
STEP_S = 10.0
"""Bound on each lockstep wait: generous on a loaded machine, never a sleep."""


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "demo", "object": "model"}]})


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


@contextlib.asynccontextmanager
async def _worker(completions: Handler, *, cancellation: bool = False) -> AsyncIterator[str]:
    """A worker serving ``completions`` (with health and the model list); its base URL."""
    app = web.Application()
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, handler_cancellation=cancellation)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def _lockstep_worker(read: list[asyncio.Event]) -> AsyncIterator[str]:
    """A worker whose stream sends event k+1 once ``read[k]`` is set by the client."""

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

    async with _worker(completions) as url:
        yield url


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


FLOOD_EVENTS = 3072
EVENT = b"data: " + b'{"choices":[{"index":0,"text":"%s"}]}' % (b"x" * 16000) + b"\n\n"


@contextlib.asynccontextmanager
async def _flood_worker(sent: list[int]) -> AsyncIterator[str]:
    """A worker that streams ``FLOOD_EVENTS`` 16 kB events as fast as it may write them
    (``sent[0]``: the events written so far; ``sent[1]``: 1 once the client went away)."""

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for _ in range(FLOOD_EVENTS):
                await response.write(EVENT)
                sent[0] += 1
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            sent[1] = 1
            raise
        return response

    async with _worker(completions, cancellation=True) as url:
        yield url


@contextlib.asynccontextmanager
async def _flooded_gateway(
    sent: list[int],
) -> AsyncIterator[tuple[GatewayHandle, aiohttp.ClientSession]]:
    """A gateway, ready, in front of ``_flood_worker(sent)``, and a client session."""
    async with _flood_worker(sent) as url:
        config = {"workers": [{"url": url}], "health": {"interval_s": 0.1, "timeout_s": 2.0}}
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await wait_until(gw.gateway.ready, message="the worker is up")
            yield gw, session


def _open_connections(gw: GatewayHandle) -> list[http1.Connection]:
    (worker,) = list(gw.gateway.pool)
    pool = worker.upstream._pool
    return [] if pool is None else list(pool._open)


async def test_a_client_that_stops_reading_holds_the_worker_back_then_gets_every_event() -> None:
    sent = [0, 0]
    async with _flooded_gateway(sent) as (gw, session):
        body = {"model": "demo", "prompt": "hi", "stream": True}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            first = await asyncio.wait_for(resp.content.readline(), STEP_S)
            assert first.startswith(b"data: ")
            # The client reads nothing more: the gateway must stop reading the worker
            # (a bounded buffer of the stream), not take the stream in as it comes.
            await wait_until(
                lambda: any(conn._paused for conn in _open_connections(gw)),
                timeout=STEP_S,
                message="the gateway paused reading the worker",
            )
            assert sent[0] < FLOOD_EVENTS // 2
            rest = await asyncio.wait_for(resp.content.read(), 4 * STEP_S)
    assert sent[0] == FLOOD_EVENTS
    assert (first + rest).count(b"data: ") == FLOOD_EVENTS + 1
    assert rest.endswith(b"data: [DONE]\n\n")


async def test_a_client_gone_mid_stream_drops_the_worker_connection() -> None:
    sent = [0, 0]
    async with _flooded_gateway(sent) as (gw, session):
        body = {"model": "demo", "prompt": "hi", "stream": True}
        resp = await session.post(gw.url + "/v1/completions", json=body)
        assert resp.status == 200
        for _ in range(3):  # a few events in: the relay is past its first chunk
            line = await asyncio.wait_for(resp.content.readline(), STEP_S)
            assert line.startswith(b"data: ")
            await asyncio.wait_for(resp.content.readline(), STEP_S)
        resp.close()  # the client goes away mid-stream
        await wait_until(lambda: sent[1] == 1, timeout=STEP_S, message="the worker saw it")
        await wait_until(lambda: gw.gateway.proxy.in_flight == 0, message="request ended")
        await wait_until(
            lambda: not _open_connections(gw), message="the worker connection released"
        )
        (worker,) = list(gw.gateway.pool)
        assert worker.in_flight == 0
    assert sent[0] < FLOOD_EVENTS


class _Told(RoundRobin):
    """Round robin that records the first tokens and TTFTs it is told of."""

    def __init__(self) -> None:
        super().__init__()
        self.first_tokens: list[str] = []
        self.ttfts: list[float | None] = []

    def on_first_token(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        self.first_tokens.append(request.request_id)

    def on_observed(
        self, request: RequestFeatures, worker: WorkerId, observed: Observation, now: Seconds
    ) -> None:
        self.ttfts.append(observed.ttft)


async def test_a_chat_streams_opening_role_chunk_is_not_its_first_token() -> None:
    # An engine (the emulated worker, some servers) sends the role at once, the first
    # token after the prefill: the TTFT the policy learns from is the latter's.
    release = asyncio.Event()

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        opening = b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
        await response.write(b"data: " + opening + b"\n\n")
        await asyncio.wait_for(release.wait(), STEP_S)
        await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')
        usage = b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}'
        await response.write(b"data: " + usage + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    policy = _Told()
    config = {
        "workers": [{"url": f"http://127.0.0.1:{runner.addresses[0][1]}"}],
        "health": {"interval_s": 0.1, "timeout_s": 2.0},
    }
    try:
        async with (
            running_gateway(config, policy=policy) as gw,
            aiohttp.ClientSession() as session,
        ):
            await wait_until(gw.gateway.ready, message="the worker is up")
            body = {"model": "demo", "messages": [{"role": "user", "content": "x"}], "stream": True}
            async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                line = await asyncio.wait_for(resp.content.readline(), STEP_S)
                assert b'"role"' in line
                assert policy.first_tokens == []  # the opening went through, no token yet
                release.set()
                rest = await asyncio.wait_for(resp.content.read(), STEP_S)
            assert b"[DONE]" in rest
            await wait_until(lambda: bool(policy.ttfts), message="the attempt ended")
    finally:
        await runner.cleanup()
    assert len(policy.first_tokens) == 1
    assert policy.ttfts[0] is not None and policy.ttfts[0] > 0.0


@pytest.mark.parametrize(
    ("chunk", "opening"),
    [
        (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n', True),
        (b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n', True),
        (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"A"}}]}\n\n', False),
        (b'data: {"choices":[{"index":0,"delta":{"content":"A"}}]}\n\n', False),
        (b'data: {"choices":[{"index":0,"text":"role"}]}\n\n', False),
        (b'data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":"stop"}]}\n\n',
         False),
        (b'event: message_start\ndata: {"type":"message_start","message":{"role":"assistant"}}\n\n'
         b'event: ping\ndata: {"type":"ping"}\n\n', True),
        (b'data: {"choices":[{"index":0,"delta":{"role":"assi', False),  # cut: a token
        (b"data: [DONE]\n\n", False),
    ],
)  # fmt: skip
def test_opening_only_tells_the_opening_from_a_token(chunk: bytes, opening: bool) -> None:
    assert opening_only(chunk) is opening
