"""Slow and hostile clients: read deadlines, a bound per address, what the parser rejects."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvgate.testing import wait_until

from .conftest import fake_fleet, gateway_port, raw_exchange

pytestmark = pytest.mark.usefixtures("both_servers")

SHORT = {"header_timeout_s": 0.4, "body_timeout_s": 0.6}
POST_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


async def test_a_head_trickled_past_its_deadline_gets_408_and_is_closed(
    no_tracebacks: pytest.LogCaptureFixture,
) -> None:
    async with fake_fleet(limits=SHORT) as (gw, _):
        started = time.monotonic()
        pieces = [bytes([b]) for b in POST_HEAD]  # one byte every 50 ms: never done in time
        answer = await raw_exchange(gateway_port(gw), pieces, gap_s=0.05, deadline_s=5.0)
        elapsed = time.monotonic() - started
    assert answer.status == 408
    assert answer.error()["code"] == "request_timeout"
    assert answer.closed
    assert elapsed < 3.0


async def test_a_connection_that_sends_nothing_is_cut_at_the_head_deadline() -> None:
    async with fake_fleet(limits=SHORT) as (gw, _):
        answer = await raw_exchange(gateway_port(gw), b"", deadline_s=5.0)
    assert answer.status == 408
    assert answer.closed


async def test_a_body_shorter_than_its_content_length_gets_408(
    no_tracebacks: pytest.LogCaptureFixture,
) -> None:
    async with fake_fleet(limits=SHORT) as (gw, _):
        head = POST_HEAD + b"Content-Length: 100\r\n\r\n"
        answer = await raw_exchange(gateway_port(gw), head + b'{"model":', deadline_s=5.0)
    assert answer.status == 408
    assert "body" in answer.error()["message"]
    assert answer.closed


async def test_a_trickled_body_is_cut_at_its_deadline() -> None:
    async with fake_fleet(limits=SHORT) as (gw, _):
        body = b'{"model":"demo","prompt":"' + b"a" * 40 + b'"}'
        head = POST_HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode()
        pieces = [head] + [body[i : i + 1] for i in range(len(body))]
        answer = await raw_exchange(gateway_port(gw), pieces, gap_s=0.05, deadline_s=5.0)
    assert answer.status == 408
    assert answer.closed


async def test_a_request_in_time_is_served_on_a_kept_alive_connection() -> None:
    async with fake_fleet(limits=SHORT) as (gw, _):
        body = b'{"model":"demo","prompt":"mode:ok"}'
        req = POST_HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        answer = await raw_exchange(gateway_port(gw), req, deadline_s=5.0)
    assert answer.status == 200
    assert not answer.closed


async def test_connections_per_address_are_bounded() -> None:
    async with fake_fleet(limits={"max_connections_per_client": 2}) as (gw, _):
        port = gateway_port(gw)
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        try:
            answer = await raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answer.status == 429
            assert answer.error()["code"] == "too_many_connections"
        finally:
            for _, writer in held:
                writer.close()
        # Once those close, the address may connect again.

        async def served() -> bool:
            answer = await raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            return answer.status == 200

        await wait_until(served, timeout=5.0, message="connections released")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    ],
)
async def test_what_the_parser_rejects_is_an_openai_error_without_traceback(
    request_bytes: bytes, no_tracebacks: pytest.LogCaptureFixture
) -> None:
    async with fake_fleet() as (gw, _):
        answer = await raw_exchange(gateway_port(gw), request_bytes, deadline_s=5.0)
    assert answer.status in (400, 431)
    assert answer.headers["content-type"].startswith("application/json")
    answer.error()
