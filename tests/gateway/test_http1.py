"""The lean HTTP/1.1 client under ``Upstream``: framing, reuse, timeouts, broken answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from kvgate.gateway import http1
from kvgate.gateway.errors import UpstreamBroken, UpstreamTimeout, UpstreamUnavailable
from kvgate.gateway.upstream import Timeouts, Upstream

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


class _Server:
    """A worker stand-in answering each request with scripted bytes; counts connections."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[_Server]]]:
    started: list[_Server] = []

    async def start(script: Script) -> _Server:
        server = _Server(script)
        server.server = await asyncio.start_server(server._handle, "127.0.0.1", 0)
        started.append(server)
        return server

    yield start
    for server in started:
        assert server.server is not None
        server.server.close()
        await server.server.wait_closed()


def _upstream(url: str, first_byte: float = 2.0) -> Upstream:
    return Upstream(url, Timeouts(connect=1.0, first_byte=first_byte, total=5.0))


async def test_content_length_body_split_across_writes_and_connection_reused(
    serve: Callable[[Script], Awaitable[_Server]],
) -> None:
    seen: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await _read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Le")
            await writer.drain()
            writer.write(b'ngth: 12\r\nX-Extra: a\r\n\r\n{"ok": ')
            await writer.drain()
            writer.write(b"true}")
            await writer.drain()

    server = await serve(script)
    upstream = _upstream(server.url)
    try:
        for _ in range(3):
            resp = await upstream.post("/v1/completions", b'{"a": 1}', {"X-Request-ID": "r1"})
            assert resp.status == 200
            assert resp.headers["x-extra"] == "a"
            assert await resp.read() == b'{"ok": true}'
    finally:
        await upstream.close()
    assert server.connections == 1
    head, _, body = seen[0].partition(b"\r\n\r\n")
    assert body == b'{"a": 1}'
    assert b"POST /v1/completions HTTP/1.1" in head
    assert b"Content-Length: 8" in head
    assert b"X-Request-ID: r1" in head


async def test_chunked_body_fed_byte_by_byte_with_interim_head_and_trailer(
    serve: Callable[[Script], Awaitable[_Server]],
) -> None:
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        b"6\r\ndata: \r\n"
        b"9;ext=1\r\nhello\n\n\r\n\r\n"
        b"0\r\nX-Trailer: t\r\n\r\n"
    )

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            for i in range(len(answer)):
                writer.write(answer[i : i + 1])
                await writer.drain()

    server = await serve(script)
    upstream = _upstream(server.url)
    try:
        for _ in range(2):
            resp = await upstream.post("/v1/completions", b"{}", {})
            assert resp.status == 200
            got = b"".join([chunk async for chunk in resp.chunks()])
            assert got == b"data: hello\n\n\r\n"
    finally:
        await upstream.close()
    assert server.connections == 1


async def test_body_read_until_close(serve: Callable[[Script], Awaitable[_Server]]) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()

    server = await serve(script)
    upstream = _upstream(server.url)
    try:
        for _ in range(2):
            resp = await upstream.post("/v1/completions", b"{}", {})
            assert await resp.read() == b"all of it"
    finally:
        await upstream.close()
    assert server.connections == 2  # never reused after "Connection: close"


async def test_silence_mid_body_is_broken_and_close_mid_body_is_broken(
    serve: Callable[[Script], Awaitable[_Server]],
) -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
        await writer.drain()
        await asyncio.sleep(5)

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nhalf\r\n")
        await writer.drain()

    for script in (stall, cut):
        server = await serve(script)
        upstream = _upstream(server.url, first_byte=0.2)
        try:
            resp = await upstream.post("/v1/completions", b"{}", {})
            with pytest.raises(UpstreamBroken):
                async for _ in resp.chunks():
                    pass
        finally:
            await upstream.close()


async def test_no_head_in_time_is_timeout_and_garbage_is_unavailable(
    serve: Callable[[Script], Awaitable[_Server]],
) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"SPDY/9 what\r\n\r\n")
        await writer.drain()

    server = await serve(silent)
    upstream = _upstream(server.url, first_byte=0.2)
    try:
        with pytest.raises(UpstreamTimeout):
            await upstream.post("/v1/completions", b"{}", {})
    finally:
        await upstream.close()
    server = await serve(garbage)
    upstream = _upstream(server.url)
    try:
        with pytest.raises(UpstreamUnavailable):
            await upstream.post("/v1/completions", b"{}", {})
    finally:
        await upstream.close()


def test_request_head_refuses_line_breaks_in_headers() -> None:
    head = http1.request_head("POST", "/v1/x", "w:80", {"A": "1"}, 2)
    assert head.endswith(b"Content-Length: 2\r\n\r\n")
    assert b"Content-Type: application/octet-stream\r\n" in head
    with pytest.raises(ValueError):
        http1.request_head("POST", "/v1/x", "w:80", {"A": "1\r\nEvil: yes"}, 2)
