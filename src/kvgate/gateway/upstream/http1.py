"""A lean HTTP/1.1 client for forwarding requests to workers, on asyncio protocols.

The forwarding path sends one small POST and passes the answer through; a
general client library spends more per request building request objects,
timers, header skip lists and reader streams than the gateway spends routing.
This one writes the request head and body in one ``write``, lets llhttp (the C
parser of Node and uvicorn, through ``httptools``) parse the answer in every
framing (``Content-Length``, chunked, read to close), and keeps idle connections
per worker for reuse. An earlier hand-written parser measured no faster and was
a second protocol implementation to keep right; llhttp is the one parser here.

One timer per request covers both timeouts: ``read_s`` (response head, then any
silence between body bytes) and ``total_s`` (the whole exchange); it is re-armed
only when it fires early, not per chunk. Errors are this module's own
(``Http1Error`` and subclasses); ``upstream`` translates them.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections import deque
from collections.abc import Callable, Mapping
from typing import cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from kvgate.gateway.timers import LazyTimer

_MAX_HEAD = 64 * 1024
"""A response head larger than this is a protocol error."""

_PAUSE_AT = 256 * 1024
"""Body bytes buffered (not yet taken by the reader) at which reading pauses."""


def _frames_body(name: bytes, value: bytes) -> bool:
    """True for a header that delimits the body (so it is not read until close)."""
    lower = name.lower()
    if lower == b"content-length":
        return True
    # Only a transfer coding ending in "chunked" frames a response (RFC 9112 6.3).
    return lower == b"transfer-encoding" and value.lower().rsplit(b",", 1)[-1].strip() == b"chunked"


class Http1Error(Exception):
    """A failed exchange with a worker."""


class ConnectError(Http1Error):
    """The TCP (or TLS) connection could not be opened."""


class ConnectTimeoutError(ConnectError):
    """Opening the connection took longer than the connect timeout."""


class ReadTimeoutError(Http1Error):
    """No response head, or no body bytes, within the read timeout (or past the total)."""


class DeadlineError(ReadTimeoutError):
    """The exchange was still going at its total deadline (not a silence of the worker's)."""


class DisconnectedError(Http1Error):
    """The worker closed the connection before the response was complete."""


class ProtocolError(Http1Error):
    """The worker's response is not valid HTTP/1.1."""


class Connection(asyncio.Protocol):
    """One keep-alive connection to a worker, carrying one exchange at a time.

    The bytes are parsed by llhttp (``httptools.HttpResponseParser``), the
    parser Node and uvicorn use; one parser lives as long as the connection, as
    HTTP/1.1 keep-alive asks. Its callbacks only record what they see: every
    decision (done, reusable, failed) is taken here, outside the C parser.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._timer = LazyTimer(loop)
        """The exchange's read deadline: one timer kept across the connection's exchanges."""
        self._parser = httptools.HttpResponseParser(self)
        # RFC 9112 allows whitespace before a chunk extension (BWS): accept exactly that,
        # nothing else llhttp refuses.
        self._parser.set_dangerous_leniencies(lenient_spaces_after_chunk_size=True)
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: CIMultiDictProxy[str] | None = None
        self.keep_alive = True
        self.done = False
        self._head_waiter: asyncio.Future[None] | None = None
        self._data_waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[bytes], bool] | None = None
        """Takes body bytes as they arrive while the reader waits (see ``arrival``)."""
        self._pieces: list[bytes] = []
        self._pending = 0
        self._paused = False
        self._until_close = False
        self._head_bytes = 0
        self._fields: list[tuple[bytes, bytes]] = []
        self._field_bytes = 0
        self._error: Http1Error | None = None
        self._last_io = 0.0
        self._read_s = 0.0
        self._deadline = 0.0

    # -- asyncio.Protocol -----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        """A clean close ends a read-to-close body; anything else unfinished is an error."""
        self.closed = True
        if self.done or self._head_waiter is None:
            return
        # Only the worker's orderly close (no error, and not our own abort after a
        # timeout or a bad response) marks a read-to-close body complete: a reset or
        # an abort mid-body must not pass a truncated body off as the whole one.
        if exc is None and self._error is None and self.headers is not None and self._until_close:
            self._finish()
        else:
            self._fail(DisconnectedError(f"the worker closed the connection ({exc or 'EOF'})"))

    def data_received(self, data: bytes) -> None:
        """Feed the parser; its callbacks below collect the head and the body."""
        self._last_io = self._loop.time()
        if self._head_waiter is None or self.done or self._error is not None:
            # Bytes outside an exchange: the connection cannot be trusted for reuse.
            self.keep_alive = False
            return
        if self.headers is None:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            # ``feed_data`` may have ended the answer: mypy keeps ``done`` False from the
            # check above, hence the cast.
            if cast(bool, self.done):
                # Bytes past a complete answer (after ``Connection: close``, say):
                # the answer stands, the connection is not reused.
                self.keep_alive = False
            else:
                self._fail(ProtocolError(f"invalid response from the worker: {exc}"))
            return
        if self.headers is None and self._head_bytes > _MAX_HEAD and self._error is None:
            # llhttp sets no limit of its own; this bounds what it and we buffer.
            self._fail(ProtocolError("response head too large"))

    def eof_received(self) -> bool | None:
        """Close our side too (``connection_lost`` follows)."""
        return None

    # -- llhttp callbacks (called from ``feed_data``; they never raise) -------------

    def on_message_begin(self) -> None:
        """A new message: after a complete answer, bytes the worker had no reason to send."""
        if self.done:
            self.keep_alive = False
        self._fields = []
        self._field_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header field (llhttp joins a field split across reads)."""
        self._fields.append((name, value))
        self._field_bytes += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        """The head is complete: publish it, unless it is an interim (1xx) one."""
        if self.done or self._error is not None:
            return
        if self._field_bytes > _MAX_HEAD:
            # A whole oversized head can arrive in one read, past the check on partial ones.
            self._fail(ProtocolError("response head too large"))
            return
        parser = self._parser
        status = parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                self._fail(ProtocolError("the worker switched protocols unasked"))
            return  # an interim answer: the real head follows
        headers: CIMultiDict[str] = CIMultiDict()
        framed = status in (204, 304)
        for name, value in self._fields:
            key = name.decode("ascii", "surrogateescape")
            headers.add(key, value.decode("utf-8", "surrogateescape"))
            if not framed:
                framed = _frames_body(name, value)
        self._fields = []
        self.status = status
        self._until_close = not framed
        self.keep_alive = parser.should_keep_alive() and not self._until_close
        self.headers = CIMultiDictProxy(headers)
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        """Body bytes, framing already removed."""
        sink = self._sink
        if sink is not None:
            # Set only while nothing is buffered (the sink sees the bytes in order), and
            # dropped as the body ends or fails (``_wake``).
            if not sink(body):
                self._wake()
        elif not self.done and self._error is None:
            self._push(body)

    def on_message_complete(self) -> None:
        """The answer ended (an interim 1xx one does not count)."""
        if self.headers is not None and not self.done and self._error is None:
            self._finish()

    # -- the exchange ---------------------------------------------------------

    def start(self, request: bytes, read_s: float, total_s: float) -> None:
        """Send one request (head and body in one write) and arm the timeouts."""
        assert self.transport is not None
        if self._paused:
            # The last exchange ended with its body untaken and reading paused.
            self.transport.resume_reading()
        self._reset()
        loop = self._loop
        now = loop.time()
        self._last_io = now
        self._read_s = read_s
        self._deadline = now + total_s
        self._head_waiter = loop.create_future()
        due = now + read_s
        self._timer.arm_at(due if due < self._deadline else self._deadline, self._on_timer)
        self.transport.write(request)

    async def head(self) -> None:
        """Wait for the response head (``status`` and ``headers`` are set after)."""
        assert self._head_waiter is not None
        await self._head_waiter
        if self.headers is None:
            raise self._error or DisconnectedError("no response")

    def take(self) -> bytes:
        """The body bytes received since the last call (maybe empty)."""
        pieces = self._pieces
        if not pieces:
            return b""
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        self._pending = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def arrival(self, sink: Callable[[bytes], bool] | None) -> asyncio.Future[None]:
        """A future done when body bytes arrive, the body ends, or the exchange fails.

        Only when nothing is waiting to be taken (``take`` gave nothing, not ``done``,
        no ``error``). With ``sink``, body bytes go straight to it from ``data_received``
        instead (no wake, no future per chunk) until it returns False: then the future
        is done. The sink is dropped as the future completes; a future left by a
        cancelled wait is done, so ``_wake`` skips it and the next call replaces it.
        """
        waiter = self._data_waiter = self._loop.create_future()
        self._sink = sink
        return waiter

    @property
    def error(self) -> Http1Error | None:
        """Why the exchange failed, if it did."""
        return self._error

    def abort(self) -> None:
        """Drop the connection now (the worker sees the client go away)."""
        self._cancel_timer()
        self.closed = True
        self._sink = None
        if self.transport is not None:
            self.transport.abort()

    @property
    def ready(self) -> bool:
        """True when body bytes, or the body's end, arrived and were not taken yet."""
        return bool(self._pieces) or self.done

    @property
    def reusable(self) -> bool:
        """True when the exchange finished cleanly and the connection may carry another."""
        return self.done and self.keep_alive and not self.closed and self._error is None

    # -- internals --------------------------------------------------------------

    def _push(self, data: bytes) -> None:
        if not data:
            return
        self._pieces.append(data)
        self._pending += len(data)
        if self._pending > _PAUSE_AT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self.done = True
        self._timer.disarm()
        self._wake()

    def _fail(self, exc: Http1Error) -> None:
        if self._error is None:
            self._error = exc
        self.keep_alive = False
        self._cancel_timer()
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._wake()
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()

    def _wake(self) -> None:
        self._sink = None
        waiter = self._data_waiter
        if waiter is not None:
            self._data_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _cancel_timer(self) -> None:
        self._timer.cancel()

    def _on_timer(self) -> None:
        if self.done:
            return
        now = self._loop.time()
        due = min(self._last_io + self._read_s, self._deadline)
        if now >= self._deadline:
            self._fail(DeadlineError("past the request's total timeout"))
        elif now >= due:
            self._fail(ReadTimeoutError("timed out waiting for the worker"))
        else:
            self._timer.arm_at(due, self._on_timer)


class ConnectionPool:
    """Idle keep-alive connections to one worker, most recently used first."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl: ssl_module.SSLContext | None,
        connect_s: float,
        keepalive_s: float,
        limit: int = 0,
    ) -> None:
        self.host = host
        self.port = port
        self.ssl = ssl
        self.connect_s = connect_s
        self.keepalive_s = keepalive_s
        self._idle: deque[Connection] = deque()
        self._slots = asyncio.Semaphore(limit) if limit > 0 else None
        self._open: set[Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the connections live in (``asyncio.get_running_loop`` makes a
        ``getpid`` system call: not one per request)."""

    async def acquire(self) -> Connection:
        """An idle live connection, or a new one (``ConnectError`` if it cannot open)."""
        if self._slots is not None:
            await self._slots.acquire()
        try:
            loop = self._loop
            if loop is None or not loop.is_running():
                loop = self._loop = asyncio.get_running_loop()
            now = loop.time()
            idle = self._idle
            while idle:
                conn = idle.pop()
                if conn.reusable and now - conn.idle_since < self.keepalive_s:
                    return conn
                self._discard(conn)
            return await self._connect(loop)
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> Connection:
        try:
            async with asyncio.timeout(self.connect_s):
                _, conn = await loop.create_connection(
                    lambda: Connection(loop),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl is not None else None,
                )
        except TimeoutError:
            raise ConnectTimeoutError(f"connect timeout to {self.host}:{self.port}") from None
        except OSError as exc:
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
        self._open.add(conn)
        return conn

    def release(self, conn: Connection) -> None:
        """Done with ``conn``: kept for reuse when its exchange ended cleanly, else dropped."""
        if self._slots is not None:
            self._slots.release()
        if conn.reusable:
            conn.idle_since = conn._loop.time()
            self._idle.append(conn)
        else:
            conn.abort()
            self._discard(conn)

    def _discard(self, conn: Connection) -> None:
        self._open.discard(conn)
        if not conn.closed:
            conn.abort()

    def close(self) -> None:
        """Drop every connection, idle or busy."""
        for conn in list(self._open):
            conn.abort()
        self._open.clear()
        self._idle.clear()
        self._loop = None


def request_head(
    method: str, target: str, host: str, headers: Mapping[str, str], body_length: int
) -> bytes:
    """The request line and headers, with ``Host`` and ``Content-Length`` set here."""
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
    has_type = False
    for name, value in headers.items():
        lower = name.lower()
        if lower in ("host", "content-length", "transfer-encoding"):
            continue
        if lower == "content-type":
            has_type = True
        lines.append(f"{name}: {value}\r\n")
    if not has_type:
        lines.append("Content-Type: application/octet-stream\r\n")
    lines.append(f"Content-Length: {body_length}\r\n\r\n")
    text = "".join(lines)
    breaks = len(lines) + 2
    if text.count("\n") != breaks or text.count("\r") != breaks:
        raise ValueError("a header name or value holds a line break")
    return text.encode("utf-8", "surrogateescape")
