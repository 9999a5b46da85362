"""The data plane's own HTTP/1.1 server: a protocol on llhttp (``httptools``) and uvloop.

aiohttp's server builds a request object, runs the middleware chain and a
response object for every request; for the two generation endpoints that is a
quarter of the gateway's CPU per request. ``DataPlane`` accepts every client
connection on the gateway's one port and serves ``POST /v1/chat/completions``
and ``POST /v1/completions`` itself, through the proxy's ``Exchange``
interface. The first request on a connection for anything else (admin,
metrics, the dashboard, the pass-through endpoints, other methods, an upgrade,
an encoded body) hands the connection over to aiohttp's per-connection handler,
with the bytes of that request, for the rest of its life: one port, and every
other path served exactly as before.

What a client connection gets here, as on aiohttp's (``connection.py``):

- keep-alive, and pipelined requests answered in order (one at a time; reading
  pauses while one waits);
- ``Content-Length`` and chunked request bodies, ``Expect: 100-continue``;
- limits: the request line, headers' count and bytes (431), the body (413,
  before reading a declared one);
- deadlines: the head within ``header_timeout_s`` of the connection opening or of
  its first byte after an idle keep-alive, the body within ``body_timeout_s`` of
  the head (408), idle keep-alive connections closed after ``keepalive_s``;
- a bound on connections per address (429), shared with aiohttp's connections;
- what llhttp rejects answered with an OpenAI-shaped 400, logged on one
  rate-limited line;
- a client that goes away cancels its request's handler (the proxy drops the
  upstream request and releases the lease);
- streams relayed chunk by chunk, waiting while the client's buffer is full.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools

from kvgate.core.prefix import Endpoint
from kvgate.gateway.dataplane.connection import ClientConnections
from kvgate.gateway.dataplane.errors import (
    BodyTooLargeError,
    GatewayError,
    HeadersTooLargeError,
    InvalidRequestError,
    RequestTimeoutError,
    error_body,
    shaped_for,
)
from kvgate.gateway.dataplane.exchange import reason_of
from kvgate.gateway.dataplane.http_answer import ServerExchange, raw_answer
from kvgate.gateway.dataplane.middleware import require_key
from kvgate.gateway.dataplane.proxy import Proxy
from kvgate.gateway.timers import LazyTimer

log = logging.getLogger("kvgate.gateway.listener")

ROUTES: dict[bytes, tuple[str, Endpoint]] = {
    b"/v1/chat/completions": ("/v1/chat/completions", "chat"),
    b"/v1/completions": ("/v1/completions", "completions"),
    b"/v1/messages": ("/v1/messages", "messages"),
}
"""The paths served here (``POST`` only): the proxy's path and endpoint for each."""


@dataclass(frozen=True, slots=True)
class DataPlaneLimits:
    """What one client connection may send, and how long it may take (``limits:``)."""

    max_header_bytes: int = 8190
    max_headers: int = 128
    max_line_bytes: int = 65536
    max_body_bytes: int = 10 * 1024 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_s: float = 75.0
    api_keys: tuple[bytes, ...] = ()
    """Keys a ``/v1/`` request must present (empty: none asked)."""


class _RefusedError(Exception):
    """Raised from a parser callback: answer ``error`` and close the connection."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(error.message)
        self.error = error


class _HandOverError(Exception):
    """Raised from a parser callback: the request is aiohttp's to serve."""


class DataPlane:
    """What the connections of one listener share; calling it makes a connection."""

    def __init__(
        self,
        proxy: Proxy,
        limits: DataPlaneLimits,
        clients: ClientConnections,
        fallback: Callable[[], asyncio.Protocol],
    ) -> None:
        self.proxy = proxy
        self.limits = limits
        self.clients = clients
        self.fallback = fallback
        """aiohttp's per-connection handler, for connections handed over."""
        self.connections: set[DataPlaneConnection] = set()
        self.server: asyncio.Server | None = None

    def __call__(self) -> DataPlaneConnection:
        return DataPlaneConnection(self)

    async def start(
        self, host: str, port: int, *, reuse_port: bool = False, backlog: int = 1024
    ) -> int:
        """Listen on ``host:port``; the port bound."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            self, host, port, reuse_port=reuse_port or None, backlog=backlog
        )
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and close every connection still served here."""
        if self.server is not None:
            # Not ``wait_closed``: connections handed to aiohttp close with its runner.
            self.server.close()
            self.server = None
        self.cut()

    def cut(self) -> None:
        """Close every connection now (their handlers are cancelled)."""
        for connection in list(self.connections):
            connection.close()


class DataPlaneConnection(asyncio.Protocol):
    """One client connection: llhttp's callbacks, the deadlines, the answers in order."""

    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane
        self._limits = plane.limits
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._address: str | None = None
        self.peer: str | None = None
        """The peer's IP address (``None``: not an IP socket), kept past the close."""
        self._timer = LazyTimer(self._loop)
        """The deadline in force (the head's, the body's or keep-alive's): one per connection."""
        # The request being parsed.
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._header_bytes = 0
        self._head_bytes = 0
        """Bytes received for the head being read after the read it began in."""
        self._max_head = self._limits.max_line_bytes + 4 * self._limits.max_header_bytes
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._route: tuple[str, Endpoint] | None = None
        self._in_message = False
        # For a hand-over: the chunks since the message began (None: it began mid-chunk).
        self._head_raw: list[bytes] | None = None
        self._chunk = b""
        self._fresh = False
        # Requests parsed, waiting for their turn; the one being answered.
        self._waiting: deque[ServerExchange] = deque()
        self._task: asyncio.Task[None] | None = None
        self._after: Callable[[], None] | None = None
        """What to do once every parsed request is answered (a hand-over, a refusal)."""
        self.write_paused = False
        self._drained: asyncio.Future[None] | None = None

    # -- the connection -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not ``asyncio.Transport`` subclasses; they are ones in kind.
        self.transport = transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else None
        clients = self._plane.clients
        if not clients.admit(address):
            clients.rejected_log.warning(
                "refused a connection from %s: over %d connections from that address",
                address,
                clients.limits.max_connections_per_client,
            )
            transport.write(
                raw_answer(
                    429,
                    error_body(
                        "too many connections from your address",
                        "invalid_request_error",
                        "too_many_connections",
                    ),
                )
            )
            transport.close()
            return
        self._address = address
        self._plane.connections.add(self)
        self._arm(self._limits.header_timeout_s, self._head_late)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._forget()
        self.transport = None
        if self._task is not None:
            self._task.cancel()
            self._task = None  # a task cancelled before its first step runs no ``finally``
        self._waiting.clear()
        self._after = None
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("the client went away"))

    def _forget(self) -> None:
        """This connection is no longer served here (closed, or handed over)."""
        self._timer.cancel()
        self._plane.connections.discard(self)
        if self._address is not None:
            self._plane.clients.release(self._address)
            self._address = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    async def drain(self) -> None:
        """Wait until the client's buffer has room again."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client went away")
        if self._drained is None:
            self._drained = self._loop.create_future()
        await self._drained

    def data_received(self, data: bytes) -> None:
        self._chunk = data
        self._fresh = not self._in_message
        if self._in_message and self._route is None:
            # More of a head: llhttp hands a header over only once it is whole, so the
            # bytes of one still coming are bounded here (and the copy kept for aiohttp).
            self._head_bytes += len(data)
            if self._head_bytes > self._max_head:
                self._refuse(HeadersTooLargeError("the request head is too large"))
                return
            if self._head_raw is not None:
                self._head_raw.append(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _HandOverError):
                self._then(self._hand_over)
            elif isinstance(cause, _RefusedError):
                self._refuse(cause.error)
            else:
                raise
        except httptools.HttpParserError as exc:
            text = reason_of(exc)
            self._plane.clients.rejected_log.warning(
                "rejected a malformed request from %s: %s", self._address, text
            )
            self._refuse(
                GatewayError(
                    f"malformed HTTP request: {text}",
                    status=400,
                    type="invalid_request_error",
                    code="invalid_http",
                )
            )

    # -- llhttp's callbacks ---------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_message = True
        self._head_bytes = 0
        self._head_raw = [self._chunk] if self._fresh else None
        self._url = b""
        self._headers = []
        self._header_bytes = 0
        self._body = []
        self._body_bytes = 0
        if self._task is None and not self._waiting:
            # The first byte after an idle keep-alive: the head's deadline starts now.
            self._arm(self._limits.header_timeout_s, self._head_late)

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._limits.max_line_bytes:
            raise _RefusedError(HeadersTooLargeError("the request line is too long"))

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self._limits
        headers = self._headers
        headers.append(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )
        self._header_bytes += len(name) + len(value) + 4
        if len(headers) > limits.max_headers:
            raise _RefusedError(
                HeadersTooLargeError(f"over {limits.max_headers} request headers, the limit")
            )
        if self._header_bytes > limits.max_header_bytes:
            raise _RefusedError(
                HeadersTooLargeError(
                    f"request headers are over the limit of {limits.max_header_bytes} bytes"
                )
            )

    def on_headers_complete(self) -> None:
        parser = self._parser
        path = self._url.partition(b"?")[0]
        route = ROUTES.get(path)
        if route is None or parser.get_method() != b"POST" or parser.should_upgrade():
            raise _HandOverError
        expect: str | None = None
        length: str | None = None
        for name, value in self._headers:
            lowered = name.lower()
            if lowered == "content-encoding" and value.strip().lower() != "identity":
                raise _HandOverError  # aiohttp decodes (or refuses) encoded bodies
            if lowered == "expect":
                expect = value
            elif lowered == "content-length":
                length = value
        limit = self._limits.max_body_bytes
        if length is not None and length.strip().isdigit() and int(length) > limit:
            raise _RefusedError(
                BodyTooLargeError(
                    f"request body of {int(length)} bytes is over the limit of {limit} bytes"
                )
            )
        if expect is not None:
            if expect.strip().lower() != "100-continue":
                raise _RefusedError(
                    GatewayError(
                        "the only Expect value understood is 100-continue",
                        status=417,
                        type="invalid_request_error",
                        code="expectation_failed",
                    )
                )
            if self._task is None and self.transport is not None:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._route = route
        self._head_raw = None
        self._arm(self._limits.body_timeout_s, self._body_late)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._body_bytes += len(body)
        limit = self._limits.max_body_bytes
        if self._body_bytes > limit:
            raise _RefusedError(
                BodyTooLargeError(f"request body is larger than the limit of {limit} bytes")
            )

    def on_message_complete(self) -> None:
        self._in_message = False
        self._fresh = False  # what follows in this chunk began mid-chunk
        route = self._route
        assert route is not None
        self._route = None
        parser = self._parser
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        exchange = ServerExchange(
            self,
            route,
            self._headers,
            body,
            keep_alive=parser.should_keep_alive(),
            http11=parser.get_http_version() == "1.1",
        )
        self._disarm()
        if self._task is None:
            self._start(exchange)
        else:
            self._waiting.append(exchange)
            if self.transport is not None:
                self.transport.pause_reading()  # one request waits at most

    # -- serving --------------------------------------------------------------

    def _start(self, exchange: ServerExchange) -> None:
        self._task = self._loop.create_task(self._serve(exchange))

    async def _serve(self, exchange: ServerExchange) -> None:
        try:
            require_key(self._limits.api_keys, exchange.headers)
            path, endpoint = exchange.route
            await self._plane.proxy.handle(exchange, path, endpoint)
        except GatewayError as exc:
            await exchange.fail(shaped_for(exchange.route[0], exc))
        except (RecursionError, UnicodeError):
            await exchange.fail(
                shaped_for(
                    exchange.route[0],
                    InvalidRequestError("the request is nested too deeply or is not valid Unicode"),
                )
            )
        except ConnectionResetError:
            self.close()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unexpected error handling POST %s", exchange.route[0])
            await exchange.fail(
                shaped_for(
                    exchange.route[0],
                    GatewayError("internal gateway error", status=500, code="internal_error"),
                )
            )
        finally:
            # In the task, not a done callback a loop turn later: a keep-alive client's
            # next request, often read in that turn, would find this one still running
            # and wait in ``_waiting`` (reading paused and resumed for it).
            self._served(exchange)

    def _served(self, exchange: ServerExchange) -> None:
        """``exchange`` is answered (or its handler ended): start the next request."""
        self._task = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not exchange.reusable():
            transport.close()  # asked to close, or its answer did not end cleanly
            return
        if self._waiting:
            self._start(self._waiting.popleft())
            if not self._waiting and self._after is None:
                transport.resume_reading()
            return
        if self._after is not None:
            after, self._after = self._after, None
            after()
            return
        if not self._in_message:
            self._arm(self._limits.keepalive_s, self.close)
        elif self._route is None:
            # A head begun while this answer was being written: its deadline starts now.
            self._arm(self._limits.header_timeout_s, self._head_late)

    def _then(self, action: Callable[[], None]) -> None:
        """Do ``action`` now, or once the requests parsed before it are answered."""
        self._disarm()
        if self._task is None and not self._waiting:
            action()
            return
        self._after = action
        if self.transport is not None:
            self.transport.pause_reading()

    def _refuse(self, error: GatewayError) -> None:
        def send() -> None:
            if self.transport is not None:
                self.transport.write(raw_answer(error.status, error.body(), close=True))
                self.transport.close()

        self._then(send)

    def _hand_over(self) -> None:
        """Give the connection, and the bytes of the request in hand, to aiohttp."""
        transport = self.transport
        raw = self._head_raw
        if transport is None:
            return
        if raw is None:
            # Pipelined behind another request in one read: where it starts is unknown.
            self._refuse(
                InvalidRequestError(
                    "a pipelined request for this path cannot be served: send it after "
                    "the answer to the one before it"
                )
            )
            return
        self._forget()
        protocol = self._plane.fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if not transport.is_closing():
            transport.resume_reading()
            protocol.data_received(b"".join(raw))

    # -- deadlines ------------------------------------------------------------

    def _arm(self, delay: float, action: Callable[[], None]) -> None:
        self._timer.arm(delay, action)

    def _disarm(self) -> None:
        self._timer.disarm()

    def _head_late(self) -> None:
        if self._task is None and not self._waiting:
            self._late(f"the request head did not arrive within {self._limits.header_timeout_s:g}s")

    def _body_late(self) -> None:
        self._late(f"the request body did not arrive within {self._limits.body_timeout_s:g}s")

    def _late(self, message: str) -> None:
        self._refuse(RequestTimeoutError(message))
