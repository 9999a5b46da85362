"""One client request and its answer, as the proxy sees them: a small interface.

The proxy and the relay read a request's headers and body and write an answer
(whole, or as a stream) through an ``Exchange``; they never touch a server's
own request or response objects. Two servers implement it: aiohttp's
(``AiohttpExchange``, for every path aiohttp serves) and the protocol-level
server on llhttp (``dataplane/listener.py``), which serves the generation
endpoints without building aiohttp's request and response objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from multidict import CIMultiDict

from kvgate.gateway.dataplane.errors import BodyTooLargeError, InvalidRequestError
from kvgate.gateway.dataplane.middleware import REQUEST_ID_KEY

Headers = Sequence[tuple[str, str]]
"""Response headers as (name, value) pairs, in order (no hop-by-hop ones)."""


def reason_of(exc: BaseException) -> str:
    """The first line of an exception's text, bounded (parser messages quote input)."""
    text = str(getattr(exc, "message", "") or exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


class Exchange(Protocol):
    """A client's request and the answer written back to it."""

    @property
    def method(self) -> str:
        """The request's method (``POST``)."""

    @property
    def headers(self) -> Mapping[str, str]:
        """The request's headers; ``get`` ignores case."""

    @property
    def peer(self) -> str | None:
        """The address of the connection's other end (the client, or the hop before the
        gateway), as the socket says, never a forwarded header; ``None``: not known."""

    def set_request_id(self, request_id: str) -> None:
        """Note the request's id, so error answers the server writes carry it too."""

    async def read(self) -> bytes:
        """The whole request body (``BodyTooLargeError``, ``InvalidRequestError``,
        ``RequestTimeoutError`` when it cannot be read)."""

    async def send(self, status: int, headers: Headers, body: bytes) -> None:
        """Answer with a whole body (``ConnectionResetError``: the client is gone)."""

    async def start_stream(self, status: int, headers: Headers, *, now: bool) -> None:
        """Start a streamed answer; its head goes out at once with ``now``, else with the
        first chunk (one write, not two)."""

    async def write(self, data: bytes) -> None:
        """Send one chunk of a streamed answer, unbuffered; waits while the client's
        buffer is full (``ConnectionResetError``: the client is gone)."""

    @property
    def writes_now(self) -> bool:
        """True when ``write_now`` can send a chunk without a task (the llhttp server)."""

    def write_now(self, data: bytes) -> bool:
        """Send one chunk of a streamed answer at once, from a protocol callback; False
        when it was not sent (the client's buffer is full, or ``writes_now`` is False):
        then ``write``, which waits (``ConnectionResetError``: the client is gone)."""

    async def end(self) -> None:
        """End a streamed answer."""

    def abort(self) -> None:
        """Close the client's connection (after a stream that broke off)."""


class _StreamResponse(web.StreamResponse):
    """A stream whose head goes out with its first chunk (one write, not two)."""

    _send_headers_immediately = False


class AiohttpExchange:
    """An ``Exchange`` over aiohttp's request; ``response`` is what the handler returns."""

    __slots__ = ("request", "response")

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None

    @property
    def method(self) -> str:
        return self.request.method

    @property
    def headers(self) -> Mapping[str, str]:
        return self.request.headers

    @property
    def peer(self) -> str | None:
        return self.request.remote  # the socket's peer: the gateway clones no request

    def set_request_id(self, request_id: str) -> None:
        self.request[REQUEST_ID_KEY] = request_id

    async def read(self) -> bytes:
        request = self.request
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise BodyTooLargeError(
                f"request body is larger than the limit of {request.app._client_max_size} bytes"
            ) from exc
        except (HttpProcessingError, RequestPayloadError) as exc:
            # Bad chunked framing, a body that is not what its Content-Encoding says...
            raise InvalidRequestError(
                f"the request body cannot be read: {reason_of(exc)}"
            ) from None

    async def send(self, status: int, headers: Headers, body: bytes) -> None:
        response = web.Response(body=body, status=status, headers=CIMultiDict(headers))
        self.response = response
        await response.prepare(self.request)
        await response.write_eof()

    async def start_stream(self, status: int, headers: Headers, *, now: bool) -> None:
        response = _StreamResponse(status=status, headers=CIMultiDict(headers))
        self.response = response
        await response.prepare(self.request)
        if now:
            await response.write(b"")  # no first chunk to carry the head yet: send it alone

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        await self.response.write(data)

    writes_now = False
    """aiohttp writes a chunk only through a coroutine."""

    def write_now(self, data: bytes) -> bool:
        return False

    async def end(self) -> None:
        assert self.response is not None
        await self.response.write_eof()

    def abort(self) -> None:
        if self.request.transport is not None:
            self.request.transport.close()

    def result(self) -> web.StreamResponse:
        """What the aiohttp handler returns (a 499 placeholder when nothing was sent)."""
        return self.response if self.response is not None else web.Response(status=499)
