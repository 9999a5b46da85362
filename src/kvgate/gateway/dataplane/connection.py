"""Client connections under watch: read deadlines, a per-address bound, clean parser errors.

aiohttp's server has no deadline for a request's head or body: a client that
trickles header bytes, stops half-way through a body, or promises a
``Content-Length`` it never sends holds its connection (and its buffers)
forever. ``GuardedRequestHandler`` is aiohttp's request handler (one per
connection) with one timer more:

- the head of a request must be complete within ``header_timeout_s`` of the
  connection opening (or of the first byte after an idle keep-alive);
- its body must be complete within ``body_timeout_s`` of the head;

past either, the client gets a 408 in the OpenAI error shape and the
connection is closed. A head that never came is answered on the raw transport
(there is no request to answer through); a late body fails the handler's read
of it (``RequestTimeoutError``), so the 408 leaves through the usual error
middleware.

It also refuses a connection beyond ``max_connections_per_client`` from one
address (429, then closed), and answers what aiohttp's HTTP parser rejects
with an OpenAI-shaped 400 (431 for an over-long line) logged on one line,
rate-limited, without the traceback aiohttp would log for each: a client's bad
bytes must not be able to flood the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from kvgate.gateway.dataplane.errors import RequestTimeoutError, error_body

log = logging.getLogger("kvgate.gateway.connection")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The deadlines and bounds of one client connection (``limits:`` in the config)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections_per_client: int = 1024
    """0: no bound."""


class _RateLimitedLog:
    """At most ``per_s`` lines a second; the lines left out are counted in the next one."""

    def __init__(self, logger: logging.Logger, per_s: float = 1.0) -> None:
        self._log = logger
        self._gap = 1.0 / per_s
        self._next = 0.0
        self._skipped = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next:
            self._skipped += 1
            return
        self._next = now + self._gap
        if self._skipped:
            message += " (%d more like it not logged)"
            args = (*args, self._skipped)
            self._skipped = 0
        self._log.warning(message, *args)


class ClientConnections:
    """What the connections of one server share: their limits and a count per address."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.by_address: Counter[str] = Counter()
        self.rejected_log = _RateLimitedLog(log)

    def admit(self, address: str) -> bool:
        """Count a new connection from ``address``; False (not counted) when over the bound."""
        bound = self.limits.max_connections_per_client
        if bound and self.by_address[address] >= bound:
            return False
        self.by_address[address] += 1
        return True

    def release(self, address: str) -> None:
        """A counted connection from ``address`` closed."""
        left = self.by_address[address] - 1
        if left > 0:
            self.by_address[address] = left
        else:
            del self.by_address[address]


def _raw_response(status: int, reason: str, message: str, code: str) -> bytes:
    body = error_body(message, "invalid_request_error", code)
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class GuardedRequestHandler(RequestHandler):
    """aiohttp's per-connection handler with read deadlines and a per-address bound."""

    def __init__(self, manager: web.Server, shared: ClientConnections, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._shared = shared
        self._address: str | None = None
        self._head_since: float | None = None
        """When the head being read started (None: not reading one)."""
        self._body: tuple[float, Any] | None = None
        """(when its head completed, payload) of the request whose body is being read."""
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Refuse an address over its bound; otherwise start the head deadline."""
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        if not self._shared.admit(address):
            self._shared.rejected_log.warning(
                "refused a connection from %s: over %d connections from that address",
                address,
                self._shared.limits.max_connections_per_client,
            )
            writer = transport
            assert isinstance(writer, asyncio.WriteTransport)
            writer.write(
                _raw_response(
                    429,
                    "Too Many Requests",
                    "too many connections from your address",
                    "too_many_connections",
                )
            )
            writer.close()
            self._manager = None  # never served: connection_lost has nothing to undo
            return
        self._address = address
        super().connection_made(transport)
        self._head_since = self._loop.time()
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        """Release the address's count and the timer."""
        if self._address is not None:
            self._shared.release(self._address)
            self._address = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Parse as aiohttp does; note when a head starts and when it completes."""
        now = self._loop.time()
        if self._head_since is None and self._body is None and not self._request_in_progress:
            self._head_since = now
        before = self._request_count
        super().data_received(data)
        if self._request_count != before and self._messages:
            # A head completed (the newest message); its body now has its own deadline.
            self._head_since = None
            _, payload = self._messages[-1]
            if not payload.is_eof():
                self._body = (now, payload)
        self._arm()

    async def _handle_request(
        self,
        request: BaseRequest,
        start_time: float | None,
        request_handler: Callable[[BaseRequest], Awaitable[StreamResponse]],
    ) -> Any:
        """Serve one request; once its body is in, only the handler's own timeouts apply."""

        async def answer(req: BaseRequest) -> StreamResponse:
            # aiohttp answers an ``Expect`` header before any middleware runs: in plain
            # text for a value it does not know, and with a 500 when the value is not
            # valid text. Only ``100-continue`` means anything; the rest is refused here.
            expect = req.headers.get("Expect")
            if expect is not None and expect.strip().lower() != "100-continue":
                return web.Response(
                    status=417,
                    body=error_body(
                        "the only Expect value understood is 100-continue",
                        "invalid_request_error",
                        "expectation_failed",
                    ),
                    content_type="application/json",
                )
            return await request_handler(req)

        try:
            return await super()._handle_request(request, start_time, answer)
        finally:
            self._body = None
            self._head_since = None
            if request.content.exception() is not None:
                # A body that failed (bad framing or encoding, too slow): aiohttp would
                # read on after the answer ("lingering"), hit the same error and log it
                # with a traceback. Nothing more of it is read; the connection closes.
                self._lingering_time = 0.0

    def _arm(self) -> None:
        due = self._due()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if due is not None and self.transport is not None:
            self._watch = self._loop.call_at(due, self._on_watch)

    def _due(self) -> float | None:
        limits = self._shared.limits
        if self._body is not None:
            started, payload = self._body
            if payload.is_eof():
                self._body = None
            else:
                return started + limits.body_timeout_s
        if self._head_since is not None and not self._request_in_progress:
            return self._head_since + limits.header_timeout_s
        return None

    def _on_watch(self) -> None:
        self._watch = None
        due = self._due()
        if due is None:
            return
        if self._loop.time() < due:
            self._arm()
            return
        limits = self._shared.limits
        if self._body is not None:
            _, payload = self._body
            self._body = None
            # The handler reading the body gets the error and answers 408 through the
            # error middleware; nothing of the body is read after it (no lingering).
            self._lingering_time = 0.0
            self._keepalive = False
            payload.set_exception(
                RequestTimeoutError(
                    f"the request body did not arrive within {limits.body_timeout_s:g}s"
                )
            )
            if not self._request_in_progress:
                self._send_and_close(
                    f"the request body did not arrive within {limits.body_timeout_s:g}s"
                )
            return
        self._send_and_close(f"the request head did not arrive within {limits.header_timeout_s:g}s")

    def _send_and_close(self, message: str) -> None:
        transport = self.transport
        if transport is not None and not self._request_in_progress:
            transport.write(_raw_response(408, "Request Timeout", message, "request_timeout"))
        self.force_close()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        """An OpenAI-shaped answer to what the parser rejected; one log line, no traceback."""
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent; cannot send the error")
        text = (message or (str(exc) if exc is not None else "") or "bad request").strip()
        first = text.splitlines()[0][:200] if text else "bad request"
        code, status = (
            ("headers_too_large", 431) if isinstance(exc, LineTooLong) else ("invalid_http", status)
        )
        self._shared.rejected_log.warning(
            "rejected a malformed request from %s: %s", request.remote, first
        )
        resp = web.Response(
            status=status,
            body=error_body(f"malformed HTTP request: {first}", "invalid_request_error", code),
            content_type="application/json",
        )
        resp.force_close()
        return resp


class GuardedServer(web.Server):
    """aiohttp's low-level server, making ``GuardedRequestHandler`` connections."""

    def __init__(self, inner: web.Server, limits: ConnectionLimits) -> None:
        # The application's handler, request factory and handler options, as built
        # by aiohttp's runner; only the connection class differs.
        super().__init__(
            inner.request_handler,
            request_factory=inner.request_factory,
            handler_cancellation=inner.handler_cancellation,
            loop=inner._loop,
            **inner._kwargs,
        )
        self.clients = ClientConnections(limits)

    def __call__(self) -> RequestHandler:
        """A handler for one new connection."""
        return GuardedRequestHandler(self, self.clients, loop=self._loop, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections are ``GuardedRequestHandler``\\ s."""

    def __init__(self, app: web.Application, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._limits = limits

    async def _make_server(self) -> web.Server:
        return GuardedServer(await super()._make_server(), self._limits)
