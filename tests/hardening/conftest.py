"""Helpers for the hardening suites: raw sockets, a gateway over misbehaving workers, logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import wait_until

from .fake_worker import FakeWorker, fake_workers


@dataclass(frozen=True, slots=True)
class RawAnswer:
    """What came back on a raw connection before it closed (or the deadline)."""

    status: int | None
    headers: dict[str, str]
    body: bytes
    closed: bool

    def error(self) -> dict[str, Any]:
        """The OpenAI error object of the body (fails the test if it is not one)."""
        payload = json.loads(self.body)
        error = payload["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)
        assert "code" in error
        return dict(error)


def parse_answer(data: bytes, closed: bool) -> RawAnswer:
    """Split raw response bytes into status, headers and body (Content-Length framing)."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return RawAnswer(None, {}, data, closed)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length")
    body = rest[: int(length)] if length is not None and length.isdigit() else rest
    return RawAnswer(status, headers, body, closed)


async def raw_exchange(
    port: int,
    data: bytes | list[bytes],
    *,
    gap_s: float = 0.0,
    deadline_s: float = 10.0,
) -> RawAnswer:
    """Send ``data`` (pieces ``gap_s`` apart) on a fresh connection; read until it closes.

    Reading stops at the first complete answer unless it says ``Connection:
    close`` (then it goes on to the close), or at ``deadline_s`` (then ``closed``
    is False).
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    pieces = [data] if isinstance(data, bytes) else data
    received = bytearray()
    closed = False

    async def read() -> None:
        nonlocal closed
        while True:
            try:
                chunk = await reader.read(65536)
            except ConnectionError:
                closed = True
                return
            if not chunk:
                closed = True
                return
            received.extend(chunk)
            answer = parse_answer(bytes(received), False)
            length = answer.headers.get("content-length")
            complete = length is not None and length.isdigit() and len(answer.body) >= int(length)
            if complete and answer.headers.get("connection", "").lower() != "close":
                return  # kept alive: the answer is all there is to read

    # Read while writing: a server that answers early (408, 429) is heard before
    # more bytes reach its closed socket and a reset discards the answer.
    reading = asyncio.ensure_future(read())
    try:
        async with asyncio.timeout(deadline_s):
            for piece in pieces:
                if reading.done():
                    break
                try:
                    writer.write(piece)
                    await writer.drain()
                except ConnectionError:
                    break
                if gap_s:
                    await asyncio.wait([reading], timeout=gap_s)
            await reading
    except TimeoutError:
        pass
    finally:
        reading.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return parse_answer(bytes(received), closed)


def gateway_port(gw: GatewayHandle) -> int:
    """The port a test gateway listens on."""
    return int(gw.url.rsplit(":", 1)[1])


@contextlib.asynccontextmanager
async def fake_fleet(
    count: int = 2, worker: dict[str, Any] | None = None, **overrides: Any
) -> AsyncIterator[tuple[GatewayHandle, list[FakeWorker]]]:
    """A gateway over ``count`` misbehaving workers (model ``demo``, ``worker`` options
    added to each one's config), all up."""
    async with fake_workers(count) as fakes:
        config: dict[str, Any] = {
            "workers": [{"url": f.url, "model": "demo", **(worker or {})} for f in fakes],
            "health": {"interval_s": 0.1, "timeout_s": 2.0},
            "retries": {"backoff_base_s": 0.0, "backoff_max_s": 0.0},
            "timeouts": {"first_byte_s": 2.0, "total_s": 5.0},
        }
        config.update(overrides)
        async with running_gateway(config) as gw:
            await wait_until(
                lambda: all(w.probe_ok and not w.ejected for w in gw.gateway.pool),
                message="every worker up",
            )
            yield gw, fakes


@pytest.fixture
def no_tracebacks(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Fail the test if anything logged a traceback (a client's bad input must not)."""
    caplog.set_level(logging.DEBUG)
    yield caplog
    with_trace = [r for r in caplog.records if r.exc_info or r.exc_text or r.stack_info]
    assert not with_trace, [f"{r.name}: {r.getMessage()}" for r in with_trace]
