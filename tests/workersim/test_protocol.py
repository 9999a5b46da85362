"""Bad input gets OpenAI-style 4xx errors, never a traceback or a 500."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.workersim import WorkerHandle

from .conftest import FAST
from .helpers import assert_openai_error, get_json, post

GOOD_CHAT: dict[str, Any] = {"model": FAST.model, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": FAST.model}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({**GOOD_CHAT, "messages": "hi"}, "messages"),
        ({**GOOD_CHAT, "messages": []}, "messages"),
        ({**GOOD_CHAT, "messages": [{"content": "no role"}]}, "messages.0.role"),
        ({**GOOD_CHAT, "max_tokens": 0}, "max_tokens"),
        ({**GOOD_CHAT, "max_tokens": "many"}, "max_tokens"),
        ({**GOOD_CHAT, "n": 2}, "n"),
        ({**GOOD_CHAT, "stream": "yes please"}, "stream"),
    ],
)
async def test_invalid_chat_fields_are_400_naming_the_field(
    worker: WorkerHandle, body: dict[str, Any], param: str
) -> None:
    status, answer = await post(worker.url + "/v1/chat/completions", body)
    assert status == 400
    error = assert_openai_error(answer, "invalid_request_error")
    assert error["param"] == param


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"text"', b"\xff\xfe"])
async def test_malformed_bodies_are_400(worker: WorkerHandle, raw: bytes) -> None:
    for path in ("/v1/chat/completions", "/v1/completions", "/kv/offload", "/admin/faults"):
        status, answer = await post(worker.url + path, None, raw=raw)
        assert status == 400, path
        assert_openai_error(answer, "invalid_request_error")


async def test_invalid_completion_prompt_is_400(worker: WorkerHandle) -> None:
    url = worker.url + "/v1/completions"
    for prompt in ("", [], ["a", "b"], {"text": "x"}):
        status, answer = await post(url, {"model": FAST.model, "prompt": prompt})
        assert status == 400, prompt
        assert assert_openai_error(answer)["param"] == "prompt"


async def test_unknown_model_is_404(worker: WorkerHandle) -> None:
    status, answer = await post(worker.url + "/v1/chat/completions", {**GOOD_CHAT, "model": "nope"})
    assert status == 404
    assert assert_openai_error(answer)["code"] == "model_not_found"


async def test_too_long_a_request_is_400(worker: WorkerHandle) -> None:
    capacity = worker.worker.context_limit
    status, answer = await post(
        worker.url + "/v1/chat/completions", {**GOOD_CHAT, "max_tokens": capacity}
    )
    assert status == 400
    assert assert_openai_error(answer)["code"] == "context_length_exceeded"
    status, answer = await post(
        worker.url + "/v1/completions",
        {"model": FAST.model, "prompt": list(range(capacity + 1)), "max_tokens": 1},
    )
    assert status == 400
    assert assert_openai_error(answer)["code"] == "context_length_exceeded"
    # Nothing was left behind in the engine.
    assert not worker.engine.has_work()


async def test_unknown_route_and_method_are_openai_errors(worker: WorkerHandle) -> None:
    status, answer = await get_json(worker.url + "/v1/nothing")
    assert status == 404
    assert_openai_error(answer)
    status, answer = await get_json(worker.url + "/v1/chat/completions")
    assert status == 405
    assert_openai_error(answer)
