"""The one upstream boundary: the only module that knows how kvgate talks HTTP to workers.

Each worker gets one ``Upstream``. Forwarded requests go over ``http1``'s lean
keep-alive connections (the hot path: one write, a bytes-level parser, one
timer per request); short calls (health probes, metrics scrapes, control
calls) use a pooled aiohttp client session. Errors of both are translated here
into kvgate's own (``UpstreamUnavailable``, ``UpstreamTimeout``,
``UpstreamBroken``), so nothing above this module sees either.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

import aiohttp
from multidict import CIMultiDictProxy
from yarl import URL

from kvgate.gateway.dataplane.errors import (
    InvalidPathError,
    UpstreamBroken,
    UpstreamDeadline,
    UpstreamError,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnavailable,
)
from kvgate.gateway.upstream import http1

_MAX_CACHED_TARGETS = 64
"""Request targets remembered per worker (the fixed OpenAI paths; not every client path)."""

_DECODINGS = 3
"""Percent-decodings ``unsafe_path`` looks through (``%252e`` is ``%2e`` once decoded)."""


def unsafe_path(target: str, *, slashes: bool = True) -> str | None:
    """Why a request target (path and query, as the client sent it) must not reach a
    worker, or ``None`` when it may.

    A dot segment (``.``/``..``, literal or percent-encoded in any case, once or
    more), an encoded slash or backslash, a backslash or a NUL could let a client
    climb out of the paths the gateway serves to a worker's own endpoints, once a
    URL library or the worker resolves it. The query is not a path and is not read.
    ``slashes=False`` lets encoded slashes by (a path the gateway answers itself may
    name a worker's URL or a model ``org/name`` in one segment); never for a forward.
    """
    path = target.partition("?")[0]
    if "." not in path and "%" not in path and "\\" not in path:
        return None  # the common case: nothing to resolve
    for _ in range(_DECODINGS):
        lowered = path.lower()
        if "\\" in path or "%5c" in lowered:
            return "a backslash in the path"
        if slashes and "%2f" in lowered:
            return "an encoded slash in the path"
        if "\x00" in path or "%00" in lowered:
            return "a NUL in the path"
        if any(segment in (".", "..") for segment in path.split("/")):
            return "a dot segment in the path"
        if "%" not in path:
            return None
        path = unquote(path, errors="surrogateescape")
    return "a path encoded too many times"


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Upstream timeouts in seconds.

    ``first_byte`` bounds the wait for the response head and any silence between
    body chunks afterwards; ``total`` bounds the whole exchange.
    """

    connect: float
    first_byte: float
    total: float


def _translate(exc: BaseException, started: bool) -> UpstreamError:
    """Map a client exception (``http1``'s or aiohttp's) to kvgate's own upstream error."""
    if isinstance(exc, http1.ConnectTimeoutError | aiohttp.ConnectionTimeoutError):
        return UpstreamUnavailable(f"connect timeout: {exc}")
    if started and isinstance(exc, http1.DeadlineError):
        return UpstreamDeadline("cut off at the total timeout mid-response")
    if isinstance(exc, http1.ReadTimeoutError | asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamBroken("timed out mid-response") if started else UpstreamTimeout("timeout")
    if started:
        return UpstreamBroken(f"{type(exc).__name__}: {exc}")
    return UpstreamUnavailable(f"{type(exc).__name__}: {exc}")


_SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent")
"""Headers aiohttp would add itself to short calls (none are wanted)."""


class UpstreamResponse:
    """A worker's response whose head has arrived; the body is read or streamed."""

    __slots__ = ("_conn", "_pool", "_released", "headers", "on_release", "status")

    def __init__(self, pool: http1.ConnectionPool, conn: http1.Connection) -> None:
        assert conn.headers is not None
        self._pool = pool
        self._conn = conn
        self._released = False
        self.status: int = conn.status
        self.headers: CIMultiDictProxy[str] = conn.headers
        self.on_release: Callable[[bool], None] | None = None
        """Called once when the response is done with: True when it was read to its end
        (a llama.cpp slot lease ends here, see ``gateway.control.offload``)."""

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool."""
        parts: list[bytes] = []
        try:
            while (data := self.take()) != b"":
                if data is None:
                    await self.arrival()
                else:
                    parts.append(data)
        finally:
            self.release()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def take(self) -> bytes | None:
        """Body bytes that arrived since the last call; ``b""`` once the body ended (the
        connection goes back to the pool); ``None``: none yet (wait on ``arrival``).
        A failed exchange raises ``UpstreamBroken`` (the connection is dropped)."""
        conn = self._conn
        if data := conn.take():
            return data
        if conn.done:
            self.release()
            return b""
        error = conn.error
        if error is not None:
            self.close()
            raise _translate(error, started=True) from error
        return None

    def arrival(self, sink: Callable[[bytes], bool] | None = None) -> asyncio.Future[None]:
        """After ``take`` gave ``None``: done when more of the body is there to take.

        With ``sink``, body bytes go to it as they arrive meanwhile, without waking the
        waiter, until it returns False (``http1.Connection.arrival``).
        """
        return self._conn.arrival(sink)

    @property
    def ready(self) -> bool:
        """True when the first body bytes (or the body's end) are already here."""
        return self._conn.ready

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (never buffered beyond what arrived meanwhile)."""
        while (data := self.take()) != b"":
            if data is None:
                await self.arrival()
            else:
                yield data

    def close(self) -> None:
        """Abort: drop the connection so the worker sees the client go away."""
        self._conn.abort()
        self._finish(complete=False)

    def release(self) -> None:
        """Done with the response; a fully read connection is reused."""
        self._finish(complete=True)

    def _finish(self, *, complete: bool) -> None:
        if not self._released:
            self._released = True
            self._pool.release(self._conn)
            if self.on_release is not None:
                self.on_release(complete)


class Upstream:
    """A pooled keep-alive HTTP client to one worker."""

    def __init__(
        self,
        base_url: str,
        timeouts: Timeouts,
        *,
        limit: int = 0,
        keepalive_s: float = 30.0,
    ) -> None:
        self.base_url = base_url
        self.timeouts = timeouts
        self._limit = limit
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        self._pool: http1.ConnectionPool | None = None
        self._targets: dict[str, tuple[str, str]] = {}
        """(request target, Host header) per API path (a handful), not built per request."""
        base = URL(base_url)
        self._base_path = base.raw_path.rstrip("/")
        """The worker URL's own path (usually none): every target starts with it."""
        self._host = base.host_port_subcomponent or ""

    @property
    def host(self) -> str:
        """The ``Host`` the worker is sent (``host[:port]``): how it names itself in a URL."""
        return self._host

    @property
    def session(self) -> aiohttp.ClientSession:
        """The client session, created lazily inside the running loop."""
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limit,
                limit_per_host=0,
                keepalive_timeout=self._keepalive_s,
                ttl_dns_cache=None,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                # The client's own headers are forwarded instead.
                skip_auto_headers=_SKIP_AUTO_HEADERS,
                timeout=aiohttp.ClientTimeout(
                    total=self.timeouts.total,
                    sock_connect=self.timeouts.connect,
                    sock_read=self.timeouts.first_byte,
                ),
            )
        return self._session

    def _connections(self) -> http1.ConnectionPool:
        if self._pool is None:
            url = URL(self.base_url)
            if url.scheme not in ("http", "https") or not url.host or url.port is None:
                raise UpstreamUnavailable(f"not an http(s) worker URL: {self.base_url}")
            self._pool = http1.ConnectionPool(
                url.host,
                url.port,
                ssl=ssl.create_default_context() if url.scheme == "https" else None,
                connect_s=self.timeouts.connect,
                keepalive_s=self._keepalive_s,
                limit=self._limit,
            )
        return self._pool

    def _target(self, path: str) -> tuple[str, str]:
        found = self._targets.get(path)
        if found is None:
            # Joined as text, never through a URL library: one would resolve dot
            # segments (``/v1/%2e%2e/admin``) into a path outside the ones served.
            why = unsafe_path(path) if path.startswith("/") else "a path not starting with /"
            if why is not None:
                raise InvalidPathError(f"the path is not forwarded: {why}")
            found = (self._base_path + path, self._host)
            if len(self._targets) < _MAX_CACHED_TARGETS:  # forwarded paths come from clients
                self._targets[path] = found
        return found

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        """Send a POST to the worker and wait for the response head."""
        return await self.send("POST", path, body, headers)

    async def send(
        self,
        method: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        sent: Callable[[], None] | None = None,
    ) -> UpstreamResponse:
        """Send a request with any method to the worker and wait for the response head.

        ``sent`` is called once the request is written, before the wait: work the
        answer does not depend on runs while the worker runs.
        """
        target, host = self._target(path)
        try:
            head = http1.request_head(method, target, host, headers, len(body))
        except ValueError as exc:
            raise UpstreamUnavailable(str(exc)) from None
        pool = self._connections()
        try:
            conn = await pool.acquire()
        except http1.Http1Error as exc:
            raise _translate(exc, started=False) from exc
        t = self.timeouts
        try:
            conn.start(head + body if len(body) < 65536 else head, t.first_byte, t.total)
            if len(body) >= 65536:
                assert conn.transport is not None
                conn.transport.write(body)
            if sent is not None:
                sent()
            await conn.head()
        except http1.Http1Error as exc:
            pool.release(conn)
            raise _translate(exc, started=False) from exc
        except BaseException:
            conn.abort()
            pool.release(conn)
            raise
        return UpstreamResponse(pool, conn)

    async def get(
        self,
        url: str,
        limit_s: float,
        headers: Mapping[str, str] | None = None,
        *,
        max_bytes: int | None = None,
    ) -> tuple[int, bytes]:
        """A short GET (health probe, metrics scrape, model list); whole body read.

        A body over ``max_bytes`` is refused (``UpstreamTooLarge``) as soon as it is
        known to be, without reading the rest: a worker's page must not cost the
        gateway unbounded memory or time.
        """
        try:
            async with self.session.get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=limit_s)
            ) as resp:
                if max_bytes is None:
                    return resp.status, await resp.read()
                if (resp.content_length or 0) > max_bytes:
                    raise UpstreamTooLarge(f"the response is over {max_bytes} bytes")
                parts: list[bytes] = []
                size = 0
                while chunk := await resp.content.readany():
                    size += len(chunk)
                    if size > max_bytes:
                        raise UpstreamTooLarge(f"the response is over {max_bytes} bytes")
                    parts.append(chunk)
                return resp.status, b"".join(parts)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _translate(exc, started=False) from exc

    async def post_short(
        self, url: str, body: bytes, limit_s: float, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        """A short POST (a control call such as a KV offload); whole body read."""
        try:
            async with self.session.post(
                url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=limit_s)
            ) as resp:
                return resp.status, await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _translate(exc, started=False) from exc

    async def close(self) -> None:
        """Close every pooled connection."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None
