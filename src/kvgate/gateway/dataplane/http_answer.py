"""Answers written by the data plane's own server: the ``Exchange`` of one request.

``ServerExchange`` is what ``listener.DataPlaneConnection`` hands the proxy for
each request: the parsed head and whole body, and an answer written straight
to the transport, whole (``Content-Length``) or as a chunked stream, each chunk
in one write as it comes, waiting while the client's buffer is full.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING

from multidict import CIMultiDict

from kvgate.core.prefix import Endpoint
from kvgate.gateway.dataplane.errors import GatewayError
from kvgate.gateway.dataplane.exchange import Headers

if TYPE_CHECKING:
    from kvgate.gateway.dataplane.listener import DataPlaneConnection

REQUEST_ID = "X-Request-ID"

_LINES: dict[int, bytes] = {}


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n`` (cached per status)."""
    line = _LINES.get(status)
    if line is None:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        line = _LINES[status] = f"HTTP/1.1 {status} {reason}\r\n".encode()
    return line


def raw_answer(status: int, body: bytes, *, close: bool = True) -> bytes:
    """A whole JSON answer with its head (``Connection: close`` with ``close``)."""
    return b"%sContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status_line(status),
        len(body),
        b"Connection: close\r\n" if close else b"",
        body,
    )


def _head(status: int, headers: Headers, extra: bytes) -> bytes:
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers])
    return status_line(status) + lines.encode("utf-8", "surrogateescape") + extra


_NOTHING, _STREAMING, _DONE = 0, 1, 2


class ServerExchange:
    """One request on a ``DataPlaneConnection`` and its answer (an ``Exchange``)."""

    __slots__ = (
        "_body",
        "_conn",
        "_pending",
        "_state",
        "headers",
        "http11",
        "keep_alive",
        "request_id",
        "route",
    )

    method = "POST"

    def __init__(
        self,
        conn: DataPlaneConnection,
        route: tuple[str, Endpoint],
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        keep_alive: bool,
        http11: bool,
    ) -> None:
        self._conn = conn
        self.route = route
        """The proxy's path and endpoint for this request."""
        self.headers: Mapping[str, str] = CIMultiDict(headers)
        self._body = body
        self.keep_alive = keep_alive
        self.http11 = http11
        self.request_id: str | None = None
        self._pending: bytes | None = None
        """A stream's head, sent with its first chunk."""
        self._state = _NOTHING

    @property
    def peer(self) -> str | None:
        return self._conn.peer

    def set_request_id(self, request_id: str) -> None:
        self.request_id = request_id

    async def read(self) -> bytes:
        return self._body

    def _connection(self) -> bytes:
        if not self.keep_alive:
            return b"Connection: close\r\n"
        return b"" if self.http11 else b"Connection: keep-alive\r\n"

    async def send(self, status: int, headers: Headers, body: bytes) -> None:
        transport = self._conn.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        head = _head(status, headers, b"Content-Length: %d\r\n" % len(body) + self._connection())
        transport.write(head + b"\r\n" + body)
        self._state = _DONE
        if self._conn.write_paused:
            await self._conn.drain()

    async def start_stream(self, status: int, headers: Headers, *, now: bool) -> None:
        if not self.http11:
            self.keep_alive = False  # no chunked framing: the stream ends with the connection
        framing = b"Transfer-Encoding: chunked\r\n" if self.http11 else b""
        self._pending = _head(status, headers, framing + self._connection()) + b"\r\n"
        self._state = _STREAMING
        if now:
            await self.write(b"")

    async def write(self, data: bytes) -> None:
        conn = self._conn
        transport = conn.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        if data and self.http11:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        if self._pending is not None:
            data = self._pending + data
            self._pending = None
        if data:
            transport.write(data)
            if conn.write_paused:
                await conn.drain()

    writes_now = True

    def write_now(self, data: bytes) -> bool:
        conn = self._conn
        transport = conn.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        if conn.write_paused or self._pending is not None:
            return False  # ``write`` sends it and waits for room (or carries the head)
        transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self.http11 else data)
        return True

    async def end(self) -> None:
        if self.http11:
            await self.write_raw(b"0\r\n\r\n")
        self._state = _DONE

    async def write_raw(self, data: bytes) -> None:
        """Write ``data`` as it is (after a pending head)."""
        transport = self._conn.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        if self._pending is not None:
            data = self._pending + data
            self._pending = None
        transport.write(data)

    def abort(self) -> None:
        self.keep_alive = False
        self._conn.close()

    async def fail(self, exc: GatewayError) -> None:
        """Answer with ``exc`` (OpenAI-shaped); when an answer already began, close."""
        if self._state != _NOTHING:
            self.abort()
            return
        headers = [("Content-Type", "application/json"), *exc.headers.items()]
        if self.request_id is not None:
            headers.append((REQUEST_ID, self.request_id))
        if exc.status in {408, 413}:
            self.keep_alive = False
        try:
            await self.send(exc.status, headers, exc.body())
        except ConnectionResetError:
            self.abort()

    def reusable(self) -> bool:
        """True when the answer ended cleanly and the connection may serve another."""
        return self._state == _DONE and self.keep_alive
