"""Usage of Anthropic's Messages API answers, whole and streamed."""

from __future__ import annotations

import json
from typing import Any

from kvgate.gateway.dataplane.errors import (
    AnthropicShapedError,
    OverloadedError,
    shaped_for,
)
from kvgate.gateway.dataplane.usage import MessagesTap, Usage, usage_from_body


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()


START = _event(
    "message_start",
    {"message": {"id": "m", "usage": {"input_tokens": 30, "cache_read_input_tokens": 70}}},
)
DELTA = _event(
    "message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}}
)


def test_a_whole_answers_usage_counts_cache_reads_in_the_prompt() -> None:
    body = {
        "type": "message",
        "usage": {
            "input_tokens": 30,
            "cache_creation_input_tokens": 5,
            "cache_read_input_tokens": 70,
            "output_tokens": 9,
        },
    }
    assert usage_from_body(json.dumps(body).encode()) == Usage(105, 9, 70)


def test_a_streams_usage_joins_the_start_and_the_last_delta() -> None:
    tap = MessagesTap()
    tap.feed(START)
    for i in range(2000):  # far more than the kept tail: the start was read as it passed
        tap.feed(_event("content_block_delta", {"index": 0, "delta": {"text": f"w{i} "}}))
    assert tap.usage() is None  # no message_delta yet: not the whole answer
    tap.feed(DELTA + _event("message_stop", {}))
    assert tap.usage() == Usage(100, 9, 70)


def test_a_start_split_across_chunks_is_read() -> None:
    tap = MessagesTap()
    tap.feed(START[:20])
    tap.feed(START[20:] + DELTA)
    assert tap.usage() == Usage(100, 9, 70)


def test_errors_are_reshaped_only_on_the_messages_path() -> None:
    shed = OverloadedError("busy", retry_after=2.0, reason="queue_full")
    shaped = shaped_for("/v1/messages", shed)
    assert isinstance(shaped, AnthropicShapedError)
    assert shaped.status == 429 and shaped.headers["Retry-After"] == "2"
    assert json.loads(shaped.body()) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "busy"},
    }
    assert shaped_for("/v1/chat/completions", shed) is shed
    assert shaped_for("/v1/messages", shaped) is shaped
