"""Methods an endpoint does not take are answered by the gateway, as HTTP says, at once.

HEAD on a generation endpoint used to be forwarded by the ``/v1/`` catch-all: the
worker's bodiless 405 then held a worker slot until the first-byte timeout, and the
access log said ``POST``. Now a method an endpoint does not take is a 405 with
``Allow``, answered by the gateway in well under 100 ms, and never sent upstream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from .conftest import RawAnswer, fake_fleet, gateway_port, parse_answer, raw_exchange
from .fake_worker import FakeWorker

pytestmark = pytest.mark.usefixtures("both_servers")

POST_ONLY = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
]


def _head(method: str, target: str) -> bytes:
    return f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()


async def _head_only(port: int, request: bytes) -> tuple[RawAnswer, float]:
    """Send ``request`` and read only the answer's head (a HEAD answer has no body to
    wait for); the answer and the seconds it took."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
        took = time.monotonic() - started
    finally:
        writer.close()
    return parse_answer(head, False), took


def _upstream_methods(fakes: list[FakeWorker]) -> list[bytes]:
    """What each worker was sent, but the gateway's own probes."""
    probes = (b"GET /health ", b"GET /v1/models ", b"GET /metrics ")
    return [h.split(b"\r\n")[0] for f in fakes for h in f.heads if not h.startswith(probes)]


@pytest.mark.parametrize("path", [*POST_ONLY, "/v1/anything", "/v1/files/x"])
async def test_head_is_answered_405_with_allow_and_never_forwarded(
    path: str, no_tracebacks: object
) -> None:
    async with fake_fleet() as (gw, fakes):
        answer, took = await _head_only(gateway_port(gw), _head("HEAD", path))
        # Nothing follows the head on the connection: it is ready for the next request.
        again, _ = await _head_only(gateway_port(gw), _head("HEAD", path))
    assert answer.status == 405, answer
    allow = answer.headers["allow"]
    assert "POST" in allow and "HEAD" not in allow
    if path in POST_ONLY:
        assert allow == "POST"
    assert again.status == 405
    assert took < 0.1, took
    assert _upstream_methods(fakes) == []


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"])
@pytest.mark.parametrize("path", POST_ONLY)
async def test_other_methods_on_post_only_endpoints_are_405_allow_post(
    method: str, path: str, no_tracebacks: object
) -> None:
    async with fake_fleet() as (gw, fakes):
        answer = await raw_exchange(gateway_port(gw), _head(method, path), deadline_s=5.0)
    assert answer.status == 405, answer
    assert answer.headers["allow"] == "POST"
    if path == "/v1/messages":  # Anthropic's API: its errors leave in Anthropic's shape
        body = json.loads(answer.body)
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert answer.error()["type"] == "invalid_request_error"
    assert _upstream_methods(fakes) == []


async def test_twelve_concurrent_heads_hold_no_worker_and_eject_none() -> None:
    async with fake_fleet() as (gw, fakes):
        port = gateway_port(gw)
        answers = await asyncio.gather(
            *(_head_only(port, _head("HEAD", "/v1/chat/completions")) for _ in range(12))
        )
        assert {a.status for a, _ in answers} == {405}
        assert max(took for _, took in answers) < 0.5
        assert not any(w.ejected for w in gw.gateway.pool)
        assert all(w.in_flight == 0 for w in gw.gateway.pool)
    assert _upstream_methods(fakes) == []


async def test_the_access_log_names_the_method_forwarded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.access")
    body = b'{"model":"demo","prompt":"x"}'
    request = (
        b"DELETE /v1/files/abc HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    async with fake_fleet() as (gw, fakes):
        answer = await raw_exchange(gateway_port(gw), request)
    assert answer.status == 200, answer
    assert _upstream_methods(fakes) == [b"DELETE /v1/files/abc HTTP/1.1"]
    lines = [r.getMessage() for r in caplog.records if r.name == "kvgate.access"]
    assert any(line.startswith("DELETE /v1/files/abc 200") for line in lines), lines


@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/demo"])
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_the_model_list_takes_only_get_and_head(
    method: str, path: str, no_tracebacks: object
) -> None:
    """The gateway answers the model list itself: another method is a 405, not forwarded."""
    async with fake_fleet() as (gw, fakes):
        answer = await raw_exchange(gateway_port(gw), _head(method, path), deadline_s=5.0)
        head, _ = await _head_only(gateway_port(gw), _head("HEAD", path))
    assert answer.status == 405, answer
    assert answer.headers["allow"] == "GET, HEAD"
    assert answer.error()["code"] == "method_not_allowed"
    assert head.status == 200
    assert _upstream_methods(fakes) == []
