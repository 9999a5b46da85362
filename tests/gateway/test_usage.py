"""Reading ``usage`` from bodies and from the tail of SSE streams."""

from __future__ import annotations

import json

from kvgate.gateway.usage import StreamTap, Usage, usage_from_body

USAGE = {
    "prompt_tokens": 40,
    "completion_tokens": 8,
    "prompt_tokens_details": {"cached_tokens": 32},
}


def _event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_usage_from_a_whole_body() -> None:
    body = json.dumps({"id": "x", "usage": USAGE}).encode()
    assert usage_from_body(body) == Usage(prompt=40, completion=8, cached=32)
    assert usage_from_body(b'{"id": "x"}') is None
    assert usage_from_body(b'{"usage": ') is None


def test_stream_tap_finds_the_final_usage_across_split_chunks() -> None:
    stream = b"".join(
        [_event({"choices": [{"text": str(i)}], "usage": None}) for i in range(50)]
        + [_event({"choices": [], "usage": USAGE}), b"data: [DONE]\n\n"]
    )
    tap = StreamTap()
    for start in range(0, len(stream), 7):  # chunk boundaries fall anywhere
        tap.feed(stream[start : start + 7])
    assert tap.usage() == Usage(prompt=40, completion=8, cached=32)


def test_stream_tap_without_usage_and_with_a_long_stream() -> None:
    tap = StreamTap()
    for i in range(5000):
        tap.feed(_event({"choices": [{"text": f"token {i}"}], "usage": None}))
    assert tap.usage() is None
    tap.feed(_event({"usage": {"prompt_tokens": 3, "completion_tokens": 1}}))
    assert tap.usage() == Usage(prompt=3, completion=1, cached=0)
