"""The one upstream boundary: the only module that knows the HTTP client library.

Each worker gets one ``Upstream``: a pooled keep-alive aiohttp connector. Errors
of the client library are translated here into kvgate's own
(``UpstreamUnavailable``, ``UpstreamTimeout``, ``UpstreamBroken``), so nothing
above this module imports aiohttp's client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDictProxy

from kvgate.gateway.errors import (
    UpstreamBroken,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)


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
    """Map a client-library exception to kvgate's own upstream error."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamUnavailable(f"connect timeout: {exc}")
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamBroken("timed out mid-response") if started else UpstreamTimeout("timeout")
    if started:
        return UpstreamBroken(f"{type(exc).__name__}: {exc}")
    return UpstreamUnavailable(f"{type(exc).__name__}: {exc}")


class UpstreamResponse:
    """A worker's response whose head has arrived; the body is read or streamed."""

    __slots__ = ("_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status: int = resp.status
        self.headers: CIMultiDictProxy[str] = resp.headers

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool."""
        try:
            return await self._resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.close()
            raise _translate(exc, started=True) from exc
        finally:
            self._resp.release()

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive (never buffered beyond one read)."""
        content = self._resp.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    break
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.close()
            raise _translate(exc, started=True) from exc
        self._resp.release()

    def close(self) -> None:
        """Abort: drop the connection so the worker sees the client go away."""
        self._resp.close()

    def release(self) -> None:
        """Done with the response; a fully read connection is reused."""
        self._resp.release()


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
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
                timeout=aiohttp.ClientTimeout(
                    total=self.timeouts.total,
                    sock_connect=self.timeouts.connect,
                    sock_read=self.timeouts.first_byte,
                ),
            )
        return self._session

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        """Send a POST to the worker and wait for the response head."""
        try:
            resp = await self.session.post(self.base_url + path, data=body, headers=headers)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _translate(exc, started=False) from exc
        return UpstreamResponse(resp)

    async def get(
        self, url: str, limit_s: float, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        """A short GET (health probe, metrics scrape, model list); whole body read."""
        try:
            async with self.session.get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=limit_s)
            ) as resp:
                return resp.status, await resp.read()
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
        if self._session is not None:
            await self._session.close()
            self._session = None
