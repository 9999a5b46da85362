"""The data plane's own server (``listen.server: llhttp``): what aiohttp's did not need.

The hardening, lease, stream and OpenAI-client suites run on both servers
(``both_servers``); these cover what only this one does: serving one port with
aiohttp (a connection handed over mid-life), pipelined requests in order, and
the same on uvloop, whose transports differ from asyncio's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import uvloop

from kvgate.gateway.dataplane.connection import ClientConnections, ConnectionLimits
from kvgate.gateway.dataplane.http_answer import ServerExchange
from kvgate.gateway.dataplane.listener import DataPlane, DataPlaneLimits
from kvgate.gateway.testing import running_gateway
from kvgate.testing import wait_until

from .conftest import every_worker_up, gateway_config, worker_fleet

BODY = json.dumps(
    {"model": "demo", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
).encode()


def _post(request_id: str, body: bytes = BODY, extra: bytes = b"") -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"X-Request-ID: %s\r\nContent-Length: %d\r\n%s\r\n%s"
        % (request_id.encode(), len(body), extra, body)
    )


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer with ``Content-Length`` framing: status, headers (lower-case), body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    return status, headers, body


async def _one_port_scenario() -> None:
    """Generations on the data plane, then the connection handed to aiohttp, on one port."""
    async with (
        worker_fleet(2) as fleet,
        running_gateway({**gateway_config(fleet), "listen": {"server": "llhttp"}}) as gw,
    ):
        await every_worker_up(gw)
        port = int(gw.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in range(2):  # keep-alive on the data plane
                writer.write(_post(f"plane-{i}"))
                status, headers, body = await _answer(reader)
                assert status == 200, body
                assert headers["x-request-id"] == f"plane-{i}"
                assert gw.plane is not None and len(gw.plane.connections) == 1
                assert json.loads(body)["object"] == "chat.completion"
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            status, headers, body = await _answer(reader)
            assert status == 200 and json.loads(body) == {"status": "ok"}
            assert not gw.plane.connections  # handed over, with the bytes of its request
            writer.write(_post("after"))  # the same connection, aiohttp's from now on
            status, headers, body = await _answer(reader)
            assert status == 200 and headers["x-request-id"] == "after"
        finally:
            writer.close()


async def test_one_port_serves_generations_and_hands_the_rest_to_aiohttp() -> None:
    await _one_port_scenario()


def test_one_port_on_uvloop() -> None:
    """As above on uvloop (the loop ``kvgate serve`` runs): its transports hand over too."""
    uvloop.run(_one_port_scenario())


async def test_pipelined_requests_are_answered_in_order_and_chunked_bodies_read() -> None:
    async with (
        worker_fleet(2) as fleet,
        running_gateway({**gateway_config(fleet), "listen": {"server": "llhttp"}}) as gw,
    ):
        await every_worker_up(gw)
        port = int(gw.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        chunked = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nX-Request-ID: third\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n"
            % (10, BODY[:10], len(BODY) - 10, BODY[10:])
        )
        try:
            writer.write(_post("first") + _post("second") + chunked)  # one write, three requests
            ids = []
            for _ in range(3):
                status, headers, body = await _answer(reader)
                assert status == 200, body
                ids.append(headers["x-request-id"])
            assert ids == ["first", "second", "third"]
        finally:
            writer.close()


async def test_expect_100_continue_and_a_pipelined_admin_request_refused_cleanly() -> None:
    async with (
        worker_fleet(1) as fleet,
        running_gateway({**gateway_config(fleet), "listen": {"server": "llhttp"}}) as gw,
    ):
        await every_worker_up(gw)
        port = int(gw.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            head = _post("expect", extra=b"Expect: 100-continue\r\n")
            split = head.index(b"\r\n\r\n") + 4
            writer.write(head[:split])
            line = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert line == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(head[split:])
            status, _, _ = await _answer(reader)
            assert status == 200
            # Behind a generation in the same read, where a request for aiohttp starts
            # is unknown: the generation is answered, then an OpenAI-shaped 400.
            writer.write(_post("gen") + b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            status, headers, _ = await _answer(reader)
            assert status == 200 and headers["x-request-id"] == "gen"
            status, headers, body = await _answer(reader)
            assert status == 400 and headers["connection"] == "close"
            assert json.loads(body)["error"]["type"] == "invalid_request_error"
        finally:
            writer.close()
        await wait_until(lambda: gw.gateway.proxy.in_flight == 0, message="nothing in flight")


class _Transport:
    """Just enough of a transport for ``DataPlaneConnection``: what it was asked to do."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.calls: list[str] = []
        self.closing = False

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        self.calls.append("pause_reading")

    def resume_reading(self) -> None:
        self.calls.append("resume_reading")

    def close(self) -> None:
        self.closing = True


async def test_the_next_request_read_as_an_answer_ends_starts_without_pausing() -> None:
    """A keep-alive client's next request read in the loop turn after its answer (as a
    client woken by the answer sends it) starts at once: it does not wait for a done
    callback of the request before, with reading paused and resumed for it."""
    loop = asyncio.get_running_loop()
    transport = _Transport()
    served: list[str | None] = []

    class Proxy:
        async def handle(self, exchange: ServerExchange, path: str, endpoint: str) -> None:
            served.append(exchange.headers.get("X-Request-ID"))
            await exchange.send(200, [("Content-Type", "application/json")], b"{}")
            if len(served) == 1:
                # The next request arrives in the next loop turn, before anything the
                # end of this task schedules.
                loop.call_soon(conn.data_received, _post("second"))

    plane = DataPlane(
        cast(Any, Proxy()),
        DataPlaneLimits(),
        ClientConnections(ConnectionLimits()),
        fallback=asyncio.Protocol,
    )
    conn = plane()
    conn.connection_made(cast(Any, transport))
    conn.data_received(_post("first"))
    await wait_until(lambda: len(served) == 2 and len(transport.written) == 2)
    assert served == ["first", "second"]
    assert transport.calls == []  # never paused: no request waited for another
    conn.connection_lost(None)
