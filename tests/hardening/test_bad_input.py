"""A client's bad input gets a 4xx in the OpenAI shape, never a 500, and ejects nobody."""

from __future__ import annotations

import gzip
import json

import aiohttp
import pytest

from .conftest import fake_fleet

pytestmark = pytest.mark.usefixtures("both_servers")

URL = "/v1/completions"


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, **headers: str
) -> tuple[int, dict[str, object]]:
    async with session.post(
        url, data=body, headers={"Content-Type": "application/json", **headers}
    ) as resp:
        payload = await resp.json(content_type=None)
        return resp.status, payload


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"demo","prompt":"\\ud800"}',
        b'{"model":"demo\\udfff","prompt":"x"}',
        b'{"model":"demo","prompt":"x","user":"\\ud83d"}',
        b'{"model":"demo","messages":[{"role":"user","content":"\\udc00 hi"}]}',
        b'{"model":"demo","prompt":' + b"[" * 3000 + b"]" * 3000 + b"}",
        b'{"model":"demo","prompt":[18446744073709551616]}',
        b'{"model":"demo","prompt":[-1, 5]}',
        b'{"model":"demo","prompt":[[1, 2], [99999999999]]}',
    ],
    ids=[
        "surrogate-prompt",
        "surrogate-model",
        "surrogate-user",
        "surrogate-content",
        "deep-nesting",
        "token-id-2^64",
        "token-id-negative",
        "token-id-nested-huge",
    ],
)
async def test_bad_input_is_a_400(body: bytes, no_tracebacks: object) -> None:
    async with fake_fleet() as (gw, _), aiohttp.ClientSession() as session:
        status, payload = await _post(session, gw.url + URL, body)
        path = "/v1/chat/completions" if b"messages" in body else URL
        if path != URL:
            status, payload = await _post(session, gw.url + path, body)
    assert status == 400, payload
    error = payload["error"]
    assert isinstance(error, dict) and error["type"] == "invalid_request_error"


async def test_a_surrogate_in_the_session_header_is_a_400(no_tracebacks: object) -> None:
    async with fake_fleet() as (gw, _):
        # aiohttp decodes header bytes that are not UTF-8 to lone surrogates.
        from .conftest import gateway_port, raw_exchange

        body = b'{"model":"demo","prompt":"x"}'
        req = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Session-ID: \xff\xfe\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        answer = await raw_exchange(gateway_port(gw), req)
    assert answer.status == 400
    answer.error()


async def test_a_gzip_label_on_a_plain_body_is_a_400(no_tracebacks: object) -> None:
    async with fake_fleet() as (gw, _), aiohttp.ClientSession() as session:
        status, payload = await _post(
            session, gw.url + URL, b'{"model":"demo","prompt":"x"}', **{"Content-Encoding": "gzip"}
        )
    assert status == 400, payload


async def test_a_gzip_body_reaches_the_worker_decoded_and_unlabelled() -> None:
    async with fake_fleet(1) as (gw, _), aiohttp.ClientSession() as session:
        raw = json.dumps({"model": "demo", "prompt": "mode:echo"}).encode()
        status, payload = await _post(
            session, gw.url + URL, gzip.compress(raw), **{"Content-Encoding": "gzip"}
        )
    assert status == 200, payload
    forwarded_headers = payload["headers"]
    assert isinstance(forwarded_headers, dict)
    assert "content-encoding" not in forwarded_headers
    assert json.loads(str(payload["body"]))["prompt"] == "mode:echo"


async def test_a_request_every_worker_fails_ejects_no_worker(no_tracebacks: object) -> None:
    """12 requests each answered 500 by both workers: the request's fault, not theirs."""
    overrides = {"outlier": {"consecutive_failures": 3}}
    async with fake_fleet(2, **overrides) as (gw, _), aiohttp.ClientSession() as session:
        for _ in range(12):
            status, payload = await _post(
                session, gw.url + URL, b'{"model":"demo","prompt":"mode:poison"}'
            )
            assert status == 502
            message = str(payload["error"]["message"])  # type: ignore[index]
            assert "10.1.2.3" not in message  # the worker's own text is not echoed
        assert not any(w.ejected for w in gw.gateway.pool)
        status, _ = await _post(session, gw.url + URL, b'{"model":"demo","prompt":"x"}')
        assert status == 200
