"""A lean HTTP/1.1 client for forwarding requests to workers, on asyncio protocols.

The forwarding path sends one small POST and passes the answer through; a
general client library spends more per request building request objects,
timers, header skip lists and reader streams than the gateway spends routing.
This one writes the request head and body in one ``write``, parses the response
head with bytes operations, decodes ``Content-Length``, chunked and
read-to-close bodies, and keeps idle connections per worker for reuse.

One timer per request covers both timeouts: ``read_s`` (response head, then any
silence between body bytes) and ``total_s`` (the whole exchange); it is re-armed
only when it fires early, not per chunk. Errors are this module's own
(``Http1Error`` and subclasses); ``upstream`` translates them.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections import deque
from collections.abc import Mapping
from typing import cast

from multidict import CIMultiDict, CIMultiDictProxy

_MAX_HEAD = 64 * 1024
"""A response head larger than this is a protocol error."""

_PAUSE_AT = 256 * 1024
"""Body bytes buffered (not yet taken by the reader) at which reading pauses."""


_HEX_DIGITS = b"0123456789abcdefABCDEF"


class Http1Error(Exception):
    """A failed exchange with a worker."""


class ConnectError(Http1Error):
    """The TCP (or TLS) connection could not be opened."""


class ConnectTimeoutError(ConnectError):
    """Opening the connection took longer than the connect timeout."""


class ReadTimeoutError(Http1Error):
    """No response head, or no body bytes, within the read timeout (or past the total)."""


class DisconnectedError(Http1Error):
    """The worker closed the connection before the response was complete."""


class ProtocolError(Http1Error):
    """The worker's response is not valid HTTP/1.1."""


class Connection(asyncio.Protocol):
    """One keep-alive connection to a worker, carrying one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._buf = bytearray()
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: CIMultiDictProxy[str] | None = None
        self.keep_alive = True
        self.done = False
        self._head_waiter: asyncio.Future[None] | None = None
        self._data_waiter: asyncio.Future[None] | None = None
        self._pieces: list[bytes] = []
        self._pending = 0
        self._paused = False
        self._framing = 0  # 0 length, 1 chunked, 2 until close
        self._left = 0  # body bytes left (length) or in the current chunk (chunked)
        self._chunk_state = 0  # 0 size line, 1 data, 2 CRLF after data, 3 trailers
        self._error: Http1Error | None = None
        self._timer: asyncio.TimerHandle | None = None
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
        if exc is None and self._error is None and self.headers is not None and self._framing == 2:
            self._finish()
        else:
            self._fail(DisconnectedError(f"the worker closed the connection ({exc or 'EOF'})"))

    def data_received(self, data: bytes) -> None:
        """Parse the response head, then the body, as bytes arrive."""
        self._last_io = self._loop.time()
        if self._head_waiter is None or self.done:
            # Bytes outside an exchange: the connection cannot be trusted for reuse.
            self.keep_alive = False
            return
        if self.headers is None:
            buf = self._buf
            buf += data
            if not self._take_head(buf):
                return
            data = bytes(buf)
            buf.clear()
            waiter = self._head_waiter
            if not waiter.done():
                waiter.set_result(None)
            if self._framing == 0 and self._left == 0:
                if data:
                    self.keep_alive = False  # bytes past an empty body: never reuse
                self._finish()
                return
            if not data:
                return
        self._feed_body(data)

    def eof_received(self) -> bool | None:
        """Close our side too (``connection_lost`` follows)."""
        return None

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
        self._timer = loop.call_at(min(now + read_s, self._deadline), self._on_timer)
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

    async def wait_data(self) -> None:
        """Wait until body bytes arrive, the body ends, or the exchange fails."""
        if self._pieces or self.done:
            return
        if self._error is not None:
            raise self._error
        waiter = self._data_waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._data_waiter = None
        error = self.error
        if error is not None and not self._pieces:
            raise error

    @property
    def error(self) -> Http1Error | None:
        """Why the exchange failed, if it did."""
        return self._error

    def abort(self) -> None:
        """Drop the connection now (the worker sees the client go away)."""
        self._cancel_timer()
        self.closed = True
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

    def _take_head(self, buf: bytearray) -> bool:
        """Parse the response head off ``buf`` (skipping interim 1xx ones); True once parsed."""
        while self.headers is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    self._fail(ProtocolError("response head too large"))
                return False
            if end > _MAX_HEAD:
                # Checked here too: a whole oversized head can arrive in one read.
                self._fail(ProtocolError("response head too large"))
                return False
            head = bytes(buf[:end])
            del buf[: end + 4]
            try:
                self._parse_head(head)
            except ProtocolError as exc:
                self._fail(exc)
                return False
        return True

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        status = int(code)
        if 100 <= status < 200 and status != 101:
            return  # an interim answer: the real head follows
        headers: CIMultiDict[str] = CIMultiDict()
        length: int | None = None
        chunked = False
        keep_alive = version == b"HTTP/1.1"
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                raise ProtocolError(f"bad header line {line[:80]!r}")
            text = value.strip().decode("utf-8", "surrogateescape")
            key = name.decode("ascii", "surrogateescape")
            headers.add(key, text)
            lower = name.lower()
            if lower == b"content-length":
                if not (text.isascii() and text.isdigit()) or (
                    length is not None and int(text) != length
                ):
                    raise ProtocolError("bad Content-Length")
                length = int(text)
            elif lower == b"transfer-encoding":
                chunked = text.lower().rsplit(",", 1)[-1].strip() == "chunked"
            elif lower == b"connection":
                tokens = {t.strip() for t in text.lower().split(",")}
                if "close" in tokens:
                    keep_alive = False
                elif "keep-alive" in tokens:
                    keep_alive = True
        self.status = status
        self.keep_alive = keep_alive
        if status in (204, 304):
            self._framing, self._left = 0, 0
        elif chunked:
            self._framing, self._left = 1, 0
        elif length is not None:
            self._framing, self._left = 0, length
        else:
            self._framing = 2
            self.keep_alive = False
        self.headers = CIMultiDictProxy(headers)

    def _feed_body(self, data: bytes) -> None:
        if self._framing == 0:
            if len(data) > self._left:
                self.keep_alive = False  # more than the body: never reuse this one
                data = data[: self._left]
            self._left -= len(data)
            self._push(data)
            if self._left == 0:
                self._finish()
        elif self._framing == 1:
            self._feed_chunked(data)
        else:
            self._push(data)

    def _feed_chunked(self, data: bytes) -> None:
        buf = self._buf
        if buf:
            buf += data
            view: bytes = bytes(buf)
            buf.clear()
        else:
            view = data
        pos = 0
        size = len(view)
        out: list[bytes] = []
        while pos < size:
            state = self._chunk_state
            if state == 1:
                take = min(self._left, size - pos)
                out.append(view[pos : pos + take])
                pos += take
                self._left -= take
                if self._left == 0:
                    self._chunk_state = 2
                continue
            end = view.find(b"\r\n", pos)
            if end < 0:
                if size - pos > _MAX_HEAD:
                    self._fail_after(out, ProtocolError("chunk line too long"))
                    return
                buf += view[pos:]
                break
            line = view[pos:end]
            pos = end + 2
            if state == 0:
                digits = line.split(b";", 1)[0].strip()
                if not digits or len(digits) > 15 or digits.strip(_HEX_DIGITS):
                    # Only hex digits: int() would also take "-5", "+5", "0x5" or "1_0".
                    self._fail_after(out, ProtocolError(f"bad chunk size {digits[:20]!r}"))
                    return
                self._left = int(digits, 16)
                self._chunk_state = 1 if self._left else 3
            elif state == 2:
                if line:
                    self._fail_after(out, ProtocolError("chunk data not followed by CRLF"))
                    return
                self._chunk_state = 0
            elif not line:  # the empty line after the last chunk (and trailers)
                if pos < size:
                    self.keep_alive = False
                if out:
                    self._push(b"".join(out))
                self._finish()
                return
        if out:
            self._push(out[0] if len(out) == 1 else b"".join(out))

    def _fail_after(self, out: list[bytes], exc: Http1Error) -> None:
        """Fail the exchange, delivering first the body bytes parsed before the error."""
        if out:
            self._push(b"".join(out))
        self._fail(exc)

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
        self._cancel_timer()
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
        waiter = self._data_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        if self.done:
            return
        now = self._loop.time()
        due = min(self._last_io + self._read_s, self._deadline)
        if now >= due:
            self._fail(ReadTimeoutError("timed out waiting for the worker"))
        else:
            self._timer = self._loop.call_at(due, self._on_timer)


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

    async def acquire(self) -> Connection:
        """An idle live connection, or a new one (``ConnectError`` if it cannot open)."""
        if self._slots is not None:
            await self._slots.acquire()
        try:
            loop = asyncio.get_running_loop()
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
            conn.idle_since = asyncio.get_running_loop().time()
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
    if text.count("\n") != len(lines) + 2 or text.count("\r") != text.count("\n"):
        raise ValueError("a header name or value holds a line break")
    return text.encode("utf-8", "surrogateescape")
