"""Request targets a client controls: only normalized paths under ``/v1/`` reach a worker.

A dot segment (literal, or percent-encoded in any case), an encoded slash or
backslash would let a client climb out of ``/v1`` to a worker's own endpoints
(vLLM's ``/reset_prefix_cache`` or ``/sleep``, llama.cpp's ``/slots``, the
emulated worker's ``/admin/faults``): the gateway refuses such a target with an
OpenAI-shaped 400 and sends nothing anywhere. A recording worker proves it.
"""

from __future__ import annotations

import pytest

from kvgate.gateway.upstream.transport import unsafe_path

from .conftest import fake_fleet, gateway_port, raw_exchange
from .fake_worker import FakeWorker

pytestmark = pytest.mark.usefixtures("both_servers")

BODY = b'{"model":"demo","prompt":"x"}'

TRAVERSALS = [
    "/v1/../admin/faults",
    "/v1/%2e%2e/admin/faults",
    "/v1/%2E%2E/admin/faults",
    "/v1/%2e%2E/admin/faults",
    "/v1/.%2e/admin/faults",
    "/v1/./../admin/faults",
    "/v1/x/%2e%2e/%2e%2e/admin/faults",
    "/v1/x/../../reset_prefix_cache",
    "/v1/%2e%2e%2fadmin/faults",
    "/v1/..%2Fadmin/faults",
    "/v1/x%2f..%2f..%2fsleep",
    "/v1/%252e%252e/admin/faults",
    "/v1/..\\admin/faults",
    "/v1/%5c..%5cadmin",
    "/v1/./chat/completions",
    "/v1/chat/completions/..",
    "/v1/chat/completions/../../slots/0?action=erase",
    "/v1/completions/%2e%2e/%2e%2e/start_profile",
    "/v1/embeddings/../../sleep",
]


PROBES = {"/health", "/v1/models", "/metrics"}
"""What the gateway itself asks each worker (health, models, engine metrics)."""


def _forwarded(fakes: list[FakeWorker]) -> list[str]:
    return [target for fake in fakes for target, _, _ in fake.requests if target not in PROBES]


def _request(method: str, target: str, body: bytes = BODY) -> bytes:
    return (
        f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@pytest.mark.parametrize("target", TRAVERSALS)
@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
async def test_a_path_climbing_out_of_v1_is_refused_and_never_forwarded(
    method: str, target: str, no_tracebacks: object
) -> None:
    async with fake_fleet() as (gw, fakes):
        answer = await raw_exchange(gateway_port(gw), _request(method, target))
        # One well-formed request after it, so "nothing forwarded" is not a dead fleet.
        ok = await raw_exchange(gateway_port(gw), _request("POST", "/v1/completions"))
    assert answer.status in (400, 404), answer
    answer.error()
    assert answer.headers["content-type"].startswith("application/json")
    assert ok.status == 200, ok
    assert _forwarded(fakes) == ["/v1/completions"]


async def test_normal_v1_paths_are_forwarded_as_they_came(no_tracebacks: object) -> None:
    """Query strings and ordinary encoded characters pass through unchanged."""
    targets = ["/v1/rerank?x=1", "/v1/files/abc%20def?purpose=batch", "/v1/score"]
    async with fake_fleet() as (gw, fakes):
        for target in targets:
            answer = await raw_exchange(gateway_port(gw), _request("POST", target))
            assert answer.status is not None and answer.status < 500, answer
    assert sorted(_forwarded(fakes)) == sorted(targets)


@pytest.mark.parametrize("target", TRAVERSALS)
def test_unsafe_path_names_every_traversal(target: str) -> None:
    assert unsafe_path(target) is not None


@pytest.mark.parametrize(
    "target",
    ["/v1/completions", "/v1/models/a.b", "/v1/x?path=../../a", "/v1/files/a%20b", "/v1/.well"],
)
def test_unsafe_path_lets_ordinary_paths_through(target: str) -> None:
    assert unsafe_path(target) is None


async def test_the_gateways_own_paths_may_carry_an_encoded_slash(no_tracebacks: object) -> None:
    """A model ``org/name`` in one segment is answered by the gateway, not refused;
    only a path it forwards must have no encoded slash."""
    async with fake_fleet() as (gw, fakes):
        port = gateway_port(gw)
        card = await raw_exchange(port, _request("GET", "/v1/models/org%2Fname", b""))
        forwarded = await raw_exchange(port, _request("GET", "/v1/files/org%2Fname", b""))
    assert card.status == 404 and card.error()["code"] == "model_not_found", card
    assert forwarded.status == 400 and forwarded.error()["code"] == "invalid_path", forwarded
    assert _forwarded(fakes) == []


def test_unsafe_path_lets_encoded_slashes_by_only_when_asked() -> None:
    assert unsafe_path("/admin/workers/http%3A%2F%2Fw%3A8000/drain") is not None
    assert unsafe_path("/admin/workers/http%3A%2F%2Fw%3A8000/drain", slashes=False) is None
    assert unsafe_path("/admin/%2e%2e/v1/x", slashes=False) is not None


@pytest.mark.parametrize(
    "target",
    [
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/v1/load_lora_adapter/",
        "/v1/load%5Flora_adapter",
        "/v1/unload_lora_adapter?x=1",
    ],
)
async def test_worker_management_paths_under_v1_are_not_forwarded(
    target: str, no_tracebacks: object
) -> None:
    """vLLM's runtime LoRA endpoints live under ``/v1/``: any client (with any key) could
    load an adapter from a path or hub name of its choosing into one worker of the fleet,
    or unload the operator's, through the ``/v1/`` catch-all."""
    body = b'{"lora_name":"x","lora_path":"/etc"}'
    async with fake_fleet() as (gw, fakes):
        answer = await raw_exchange(gateway_port(gw), _request("POST", target, body))
    assert answer.status == 403, answer
    assert answer.error()["code"] == "forbidden"
    assert _forwarded(fakes) == []
