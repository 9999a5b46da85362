"""The lean HTTP/1.1 client under ``Upstream``: framing, reuse, timeouts, broken answers.

The parser is also checked on its own: hypothesis builds answers in every framing and
feeds them through a fake transport cut at arbitrary offsets.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgate.gateway.dataplane.errors import UpstreamBroken, UpstreamTimeout, UpstreamUnavailable
from kvgate.gateway.upstream import http1
from kvgate.gateway.upstream.transport import Timeouts, Upstream

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


# -- the response parser, fed through a fake transport split at every boundary -------


class _FakeTransport:
    """Stands in for the socket: records what the connection does to it."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.paused = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def abort(self) -> None:
        self.aborted = True


_BODY = st.binary(max_size=400) | st.lists(
    st.sampled_from([b"a", b"0", b"\r", b"\n", b"\r\n", b";", b"\r\n\r\n", b"0\r\n\r\n"]),
    max_size=40,
).map(b"".join)
"""Bodies, many made of the bytes HTTP framing itself uses."""


@dataclass(frozen=True)
class _Answer:
    """One response as the worker sends it, and the body the client must yield."""

    wire: bytes
    body: bytes
    framing: str  # "length", "chunked" or "close"


@st.composite
def _answers(
    draw: st.DrawFn, framings: tuple[str, ...] = ("length", "chunked", "close")
) -> _Answer:
    body = draw(_BODY)
    framing = draw(st.sampled_from(framings))
    head = b""
    if draw(st.booleans()):
        head += b"HTTP/1.1 100 Continue\r\n\r\n"
    head += b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if framing == "length":
        name = draw(st.sampled_from([b"Content-Length", b"content-length", b"CONTENT-LENGTH"]))
        return _Answer(head + name + b": %d\r\n\r\n" % len(body) + body, body, framing)
    if framing == "close":
        return _Answer(head + b"Connection: close\r\n\r\n" + body, body, framing)
    wire = [head, b"Transfer-Encoding: chunked\r\n\r\n"]
    pos = 0
    while pos < len(body):
        size = draw(st.integers(1, len(body) - pos))
        digits = draw(st.sampled_from([b"%x", b"%X", b"000%x"])) % size
        extension = draw(st.sampled_from([b"", b";a=1", b";name", b' ;q="x;y"', b" "]))
        wire += [digits, extension, b"\r\n", body[pos : pos + size], b"\r\n"]
        pos += size
    wire.append(draw(st.sampled_from([b"0", b"000", b"0;last"])) + b"\r\n")
    wire.append(draw(st.sampled_from([b"", b"X-Trailer: t\r\n", b"A: 1\r\nB: 2\r\n"])) + b"\r\n")
    return _Answer(b"".join(wire), body, framing)


def _pieces(data: st.DataObject, wire: bytes) -> list[bytes]:
    """``wire`` cut at hypothesis-chosen offsets (1-byte pieces included)."""
    if data.draw(st.booleans(), label="byte by byte"):
        return [wire[i : i + 1] for i in range(len(wire))]
    cuts = data.draw(st.sets(st.integers(1, max(1, len(wire) - 1)), max_size=len(wire)))
    bounds = [0, *sorted(cuts), len(wire)]
    return [wire[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _exchange(conn: http1.Connection, answer: _Answer, data: st.DataObject) -> bytes:
    """Run one exchange on ``conn``, feeding the answer in pieces; the body taken."""
    conn.start(b"POST / HTTP/1.1\r\n\r\n", read_s=60.0, total_s=60.0)
    taken: list[bytes] = []
    take_every = data.draw(st.integers(1, 5), label="take the body every n pieces")
    for i, piece in enumerate(_pieces(data, answer.wire)):
        assert not conn.done
        conn.data_received(piece)
        if i % take_every == 0:
            taken.append(conn.take())
    if answer.framing == "close":
        assert not conn.done
        conn.connection_lost(None)
    taken.append(conn.take())
    return b"".join(taken)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_answers(), min_size=1, max_size=3), st.data())
def test_any_split_of_any_framing_yields_exactly_the_body_and_keeps_the_connection(
    answers: list[_Answer], data: st.DataObject
) -> None:
    loop = asyncio.new_event_loop()
    try:
        conn = http1.Connection(loop)
        transport = _FakeTransport()
        conn.connection_made(cast(asyncio.Transport, transport))
        for answer in answers:
            body = _exchange(conn, answer, data)
            assert conn.error is None
            assert conn.status == 200
            assert conn.done
            assert body == answer.body
            if answer.framing == "close":
                assert not conn.reusable
                break
            assert conn.reusable  # keep-alive: the next answer comes on the same connection
        assert not transport.aborted
    finally:
        loop.close()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop that is never run: the connection only makes futures and timers."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _fed(
    loop: asyncio.AbstractEventLoop, wire: bytes, *cuts: int
) -> tuple[http1.Connection, _FakeTransport, bytes]:
    """A connection that got ``wire`` cut at ``cuts``; and the body it yielded."""
    conn = http1.Connection(loop)
    transport = _FakeTransport()
    conn.connection_made(cast(asyncio.Transport, transport))
    conn.start(b"POST / HTTP/1.1\r\n\r\n", read_s=60.0, total_s=60.0)
    bounds = [0, *cuts, len(wire)]
    for a, b in itertools.pairwise(bounds):
        conn.data_received(wire[a:b])
    return conn, transport, conn.take()


def test_a_reset_mid_read_to_close_body_is_an_error_not_a_short_body(
    loop: asyncio.AbstractEventLoop,
) -> None:
    conn, _, body = _fed(loop, b"HTTP/1.1 200 OK\r\n\r\npart of", 5)
    conn.connection_lost(ConnectionResetError("reset by peer"))
    assert body == b"part of"
    assert not conn.done
    assert isinstance(conn.error, http1.DisconnectedError)


def test_a_close_after_our_abort_does_not_complete_a_read_to_close_body(
    loop: asyncio.AbstractEventLoop,
) -> None:
    conn, transport, _ = _fed(loop, b"HTTP/1.1 200 OK\r\n\r\npart of")
    conn._fail(http1.ReadTimeoutError("silence"))  # what the timer does
    assert transport.aborted
    conn.connection_lost(None)  # the abort's own close
    assert not conn.done
    assert isinstance(conn.error, http1.ReadTimeoutError)


def test_bytes_after_an_empty_body_forbid_reuse(loop: asyncio.AbstractEventLoop) -> None:
    conn, _, body = _fed(loop, b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert body == b""
    assert conn.done
    assert not conn.reusable


def test_reuse_resumes_reading_paused_by_an_untaken_body(loop: asyncio.AbstractEventLoop) -> None:
    big = b"x" * (300 * 1024)
    conn, transport, _ = _fed(loop, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))
    conn.data_received(big)  # the whole body, never taken: reading pauses
    assert transport.paused
    assert conn.reusable
    conn.start(b"POST / HTTP/1.1\r\n\r\n", read_s=60.0, total_s=60.0)
    assert not transport.paused


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5x\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xd9\xa3\r\n\r\nhi",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nhi",
        b"HTTP/1.1 200 OK\r\n Folded: no\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
        b"SPDY/9 what\r\n\r\n",
    ],
)
def test_invalid_answers_fail_the_exchange_and_drop_the_connection(
    loop: asyncio.AbstractEventLoop, wire: bytes
) -> None:
    conn, transport, _ = _fed(loop, wire)
    assert isinstance(conn.error, http1.ProtocolError)
    assert not conn.done
    assert not conn.reusable
    assert transport.aborted


@pytest.mark.parametrize("whole", [False, True], ids=["unfinished, in pieces", "whole, one read"])
def test_a_head_larger_than_the_limit_fails(loop: asyncio.AbstractEventLoop, whole: bool) -> None:
    wire = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * (70 * 1024)
    if whole:
        conn, transport, _ = _fed(loop, wire + b"\r\nContent-Length: 2\r\n\r\n{}")
    else:
        conn, transport, _ = _fed(loop, wire, *range(1024, len(wire), 1024))
    assert isinstance(conn.error, http1.ProtocolError)
    assert "too large" in str(conn.error)
    assert not conn.done
    assert transport.aborted


@pytest.mark.parametrize("size", [b"-5", b"+5", b"0x5", b"1_0", b"", b"1" * 17])
def test_a_chunk_size_of_anything_but_hex_digits_fails_after_the_good_chunks(
    loop: asyncio.AbstractEventLoop, size: bytes
) -> None:
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
    conn, _, body = _fed(loop, wire + size + b"\r\nabcde\r\n0\r\n\r\n")
    assert body == b"hello"  # what came before the bad framing is still delivered
    assert isinstance(conn.error, http1.ProtocolError)
    assert not conn.done


def test_a_transfer_coding_not_ending_in_chunked_is_read_until_close(
    loop: asyncio.AbstractEventLoop,
) -> None:
    conn, _, body = _fed(loop, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nzipped", 20)
    assert not conn.done
    conn.connection_lost(None)
    assert conn.done
    assert body + conn.take() == b"zipped"
    assert not conn.reusable


def test_bytes_after_a_close_delimited_length_body_keep_the_answer_but_not_the_connection(
    loop: asyncio.AbstractEventLoop,
) -> None:
    conn, transport, body = _fed(
        loop, b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhiXX"
    )
    assert body == b"hi"
    assert conn.done
    assert conn.error is None
    assert not conn.reusable
    assert not transport.aborted


def test_a_sink_gets_the_body_as_it_arrives_until_it_stops(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """While the reader waits with a sink, body bytes go to it in order with no wake;
    when it says stop, the wait ends and later bytes are buffered for ``take``."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    conn, _, body = _fed(loop, head)
    assert body == b""
    got: list[bytes] = []

    def sink(data: bytes) -> bool:
        got.append(data)
        return len(got) < 2

    waiter = conn.arrival(sink)
    conn.data_received(b"1\r\na\r\n")
    assert got == [b"a"]
    assert not waiter.done()  # the sink took it: nobody woken
    conn.data_received(b"1\r\nb\r\n1\r\nc\r\n")
    assert got == [b"a", b"b"]  # it said stop after "b": "c" waits for the reader
    assert waiter.done()
    assert conn.take() == b"c"
    conn.data_received(b"1\r\nd\r\n")
    assert got == [b"a", b"b"]  # the sink is gone once the wait ended
    assert conn.take() == b"d"
    again = conn.arrival(sink)
    conn.data_received(b"0\r\n\r\n")
    assert again.done()  # the body's end wakes the reader too
    assert conn.done
    assert conn.reusable


def test_an_abort_drops_the_sink(loop: asyncio.AbstractEventLoop) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    conn, transport, _ = _fed(loop, head)
    got: list[bytes] = []
    conn.arrival(lambda data: bool(got.append(data)) or True)
    conn.abort()  # what the relay does when its client went away
    assert transport.aborted
    conn.data_received(b"1\r\na\r\n")
    assert got == []
    assert not conn.reusable
