"""Filler text and SSE framing."""

from __future__ import annotations

import json

from kvgate.engine.tokenizer import tokenize
from kvgate.workersim.responses import (
    SSE_DONE,
    ResponseHeader,
    Usage,
    filler,
    filler_tokens,
    sse_event,
)


def test_filler_is_one_engine_token_per_output_token() -> None:
    for count in (1, 2, 7, 50, 333):
        assert len(tokenize(filler(0, count))) == count


def test_filler_pieces_concatenate_to_the_whole() -> None:
    pieces = [filler(0, 3), filler(3, 1), filler(4, 10)]
    assert "".join(pieces) == filler(0, 14)


def test_sse_event_framing() -> None:
    header = ResponseHeader("chatcmpl-1", 1_700_000_000, "demo", "chat")
    event = sse_event(header.usage_chunk(Usage(10, 2, 8)))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    payload = json.loads(event[len(b"data: ") :])
    assert payload["choices"] == []
    assert payload["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_filler_tokens_match_tokenizing_prompt_and_output_together() -> None:
    for after in ("", "<|assistant|>\n", "question? ", "end.", "tab\t", "(", "naïve "):
        for count in (1, 2, 25):
            expected = tokenize(after + filler(0, count))[len(tokenize(after)) :]
            assert filler_tokens(count, after) == expected, (after, count)


def test_filler_tokens_refuse_to_merge_with_a_word() -> None:
    assert filler_tokens(3, "ends with a word") is None
    assert filler_tokens(3, "digit 7") is None
