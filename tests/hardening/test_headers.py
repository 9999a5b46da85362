"""Header values a client controls and the gateway echoes or forwards."""

from __future__ import annotations

import pytest

from .conftest import fake_fleet, gateway_port, raw_exchange

pytestmark = pytest.mark.usefixtures("both_servers")

BODY = b'{"model":"demo","prompt":"x"}'


@pytest.mark.parametrize(
    "header",
    [
        b"X-Request-ID: \xff\xfe\x80",
        b"X-Request-ID: " + b"r" * 6000,
        b"X-Session-ID: " + b"s" * 6000,
        b"Authorization: Bearer \xff",
        b"X-Kvgate-Priority: \xc3\x28",
        b"X-Kvgate-Model-Version: \xed\xa0\x80",
    ],
)
async def test_odd_header_values_get_a_clean_answer(header: bytes, no_tracebacks: object) -> None:
    async with fake_fleet() as (gw, _):
        req = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + header
            + b"\r\n"
            + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
            + BODY
        )
        answer = await raw_exchange(gateway_port(gw), req)
    assert answer.status is not None and answer.status < 500, answer
    if answer.status >= 400:
        answer.error()


async def test_a_content_length_over_the_limit_is_refused_before_the_body() -> None:
    async with fake_fleet(limits={"max_body_bytes": 1000}) as (gw, _):
        req = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 50000000\r\n\r\n" + b"{" * 100
        )
        answer = await raw_exchange(gateway_port(gw), req, deadline_s=5.0)
    assert answer.status == 413
    answer.error()


async def test_a_header_value_sent_in_pieces_without_end_is_refused_431(
    no_tracebacks: object,
) -> None:
    """A head whose one header never ends may not grow the gateway's buffers: it is
    refused once it is past the parser's limits, whole or in many reads."""
    async with fake_fleet() as (gw, _):
        start = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Filler: "
        pieces = [start] + [b"f" * 32768] * 32  # 1 MiB of one header value, never ended
        answer = await raw_exchange(gateway_port(gw), pieces, gap_s=0.01)
    assert answer.status == 431, answer
    assert answer.error()["code"] == "headers_too_large"


CREDENTIAL_LINES = [
    b"Authorization: Bearer client-key",
    b"AUTHORIZATION: Bearer client-key",
    b"AuThOrIzAtIoN: Bearer client-key",
    b"authorization: Bearer client-key",
    b"X-API-KEY: client-secret",
    b"x-api-key: client-secret",
    b"Api-Key: client-secret",
    b"PROXY-AUTHORIZATION: Basic Y2xpZW50OnNlY3JldA==",
    b"Cookie: session=client-secret",
]


def _with_credentials(extra: list[bytes]) -> bytes:
    body = b'{"model":"demo","prompt":"x"}'
    lines = [b"POST /v1/completions HTTP/1.1", b"Host: x", b"Content-Type: application/json"]
    # The gateway's own check reads ``Authorization`` in any case; the key is valid.
    lines += extra
    lines.append(f"Content-Length: {len(body)}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@pytest.mark.parametrize("line", CREDENTIAL_LINES)
async def test_no_client_credential_reaches_a_worker_in_any_header_case(
    line: bytes, no_tracebacks: object
) -> None:
    """With client API keys, the client's credentials stay at the gateway: every
    credential header is matched whatever the case of its name."""
    async with fake_fleet(api_keys=["client-key"]) as (gw, fakes):
        auth = (
            []
            if line.lower().startswith(b"authorization:")
            else [b"Authorization: Bearer client-key"]
        )
        answer = await raw_exchange(gateway_port(gw), _with_credentials([*auth, line]))
    assert answer.status == 200, answer
    heads = [head for fake in fakes for head in fake.heads if head.startswith(b"POST")]
    assert len(heads) == 1
    assert b"client-key" not in heads[0] and b"client-secret" not in heads[0], heads[0]
    assert b"Y2xpZW50OnNlY3JldA==" not in heads[0], heads[0]


@pytest.mark.parametrize("line", CREDENTIAL_LINES)
async def test_a_worker_with_its_own_key_gets_only_that_key(
    line: bytes, no_tracebacks: object
) -> None:
    """A worker with ``api_key`` gets one ``Authorization``, the gateway's, and none of
    the client's credential headers, whatever their case (no client keys configured)."""
    async with fake_fleet(worker={"api_key": "worker-key"}) as (gw, fakes):
        answer = await raw_exchange(gateway_port(gw), _with_credentials([line]))
    assert answer.status == 200, answer
    head = next(head for fake in fakes for head in fake.heads if head.startswith(b"POST"))
    lines = [h.lower() for h in head.split(b"\r\n")]
    assert [h for h in lines if h.startswith(b"authorization:")] == [
        b"authorization: bearer worker-key"
    ], head
    assert b"client-key" not in head and b"client-secret" not in head, head


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/embeddings"),
        ("GET", "/v1/files"),
        ("GET", "/nowhere"),
    ],
)
async def test_client_api_keys_guard_every_path_that_reaches_a_worker(
    method: str, path: str, no_tracebacks: object
) -> None:
    """vLLM's ``/tokenize`` and ``/detokenize`` are served outside ``/v1/``, where the key
    check stopped: without a key they reached a worker, with the gateway's own worker
    key attached. Every path but the probes, ``/metrics``, the admin API (its own guard)
    and the dashboard's page now needs a client key."""
    async with fake_fleet(api_keys=["client-key"], worker={"api_key": "worker-key"}) as (
        gw,
        fakes,
    ):
        req = (
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY
        answer = await raw_exchange(gateway_port(gw), req)
        assert answer.status == 401, answer
        answer.error()
        assert not [t for fake in fakes for t, _, _ in fake.requests if t.startswith(path)]
        for open_path in ("/healthz", "/readyz", "/health"):
            probe = await raw_exchange(
                gateway_port(gw), f"GET {open_path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            )
            assert probe.status == 200, (open_path, probe)
