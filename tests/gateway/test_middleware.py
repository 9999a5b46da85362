"""Errors the gateway makes itself: OpenAI-shaped, with the right status, never a traceback."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.policy import PolicyBase, RouteContext
from kvgate.gateway.testing import running_gateway
from kvgate.workersim.runner import WorkerHandle

from .conftest import gateway_config

BODY = {"model": "demo", "prompt": "hello", "max_tokens": 2}


async def post(url: str, **kwargs: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.post(url, **kwargs) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


def assert_openai_error(body: dict[str, Any], code: str) -> None:
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["code"] == code
    assert error["message"]


async def test_malformed_json_is_400(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        status, body, _ = await post(gw.openai_base + "/completions", data=b"{not json")
    assert status == 400
    assert_openai_error(body, "invalid_request")


async def test_missing_model_is_400_naming_the_param(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        status, body, _ = await post(gw.openai_base + "/chat/completions", json={"messages": []})
    assert status == 400
    assert body["error"]["param"] == "model"


async def test_unknown_model_is_404_model_not_found(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        status, body, _ = await post(
            gw.openai_base + "/completions", json={**BODY, "model": "nope"}
        )
    assert status == 404
    assert_openai_error(body, "model_not_found")


async def test_body_over_the_limit_is_413(workers: list[WorkerHandle]) -> None:
    config = gateway_config(workers, limits={"max_body_bytes": 1024})
    async with running_gateway(config) as gw:
        status, body, _ = await post(
            gw.openai_base + "/completions", json={**BODY, "prompt": "x" * 4096}
        )
    assert status == 413
    assert_openai_error(body, "request_too_large")


async def test_oversized_headers_are_431(workers: list[WorkerHandle]) -> None:
    config = gateway_config(workers, limits={"max_header_bytes": 1024})
    async with running_gateway(config) as gw:
        status, body, _ = await post(
            gw.openai_base + "/completions", json=BODY, headers={"X-Big": "y" * 2048}
        )
    assert status == 431
    assert_openai_error(body, "headers_too_large")


async def test_api_keys_are_required_when_configured(workers: list[WorkerHandle]) -> None:
    config = gateway_config(workers, api_keys=["sk-good"])
    async with running_gateway(config) as gw:
        url = gw.openai_base + "/completions"
        missing = await post(url, json=BODY)
        wrong = await post(url, json=BODY, headers={"Authorization": "Bearer sk-bad"})
        good = await post(url, json=BODY, headers={"Authorization": "Bearer sk-good"})
        async with aiohttp.ClientSession() as session, session.get(gw.url + "/healthz") as r:
            health = r.status
    assert missing[0] == 401 and wrong[0] == 401
    assert_openai_error(missing[1], "invalid_api_key")
    assert good[0] == 200
    assert health == 200


async def test_unknown_path_is_404_openai_shaped(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        # /v1/* is forwarded to a worker (issue 15); a path outside the API is the gateway's 404
        status, body, _ = await post(gw.url + "/v2/embeddings", json=BODY)
    assert status == 404
    assert_openai_error(body, "not_found")


class _Exploding(PolicyBase):
    name = "exploding"

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        raise RuntimeError("a bug in a policy")


async def test_unexpected_exception_is_a_500_without_traceback(
    workers: list[WorkerHandle], caplog: pytest.LogCaptureFixture
) -> None:
    async with running_gateway(gateway_config(workers), policy=_Exploding()) as gw:
        status, body, headers = await post(gw.openai_base + "/completions", json=BODY)
    assert status == 500
    assert_openai_error(body, "internal_error")
    assert "Traceback" not in str(body)
    assert headers["X-Request-ID"]
    assert "a bug in a policy" in caplog.text
