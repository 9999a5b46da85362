"""Reading ``usage`` from bodies and from the tail of SSE streams."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvgate.gateway.dataplane.usage import (
    StreamTap,
    Usage,
    UsageStripper,
    client_wants_stream_usage,
    usage_from_body,
    with_stream_usage,
)

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


def test_usage_carries_the_engines_own_ttft_where_it_reports_one() -> None:
    timed = {**USAGE, "kvgate_timing": {"ttft_s": 0.25, "e2e_s": 1.0, "worker": "GPU-1"}}
    got = usage_from_body(json.dumps({"usage": timed}).encode())
    assert got == Usage(prompt=40, completion=8, cached=32, engine_ttft=0.25)
    bad = {**USAGE, "kvgate_timing": {"ttft_s": "soon"}}
    assert usage_from_body(json.dumps({"usage": bad}).encode()) == Usage(40, 8, 32)


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


def _stream(events: list[object], crlf: bool = False) -> bytes:
    body = b"".join(_event(e) for e in events) + b"data: [DONE]\n\n"
    return body.replace(b"\n", b"\r\n") if crlf else body


@pytest.mark.parametrize("crlf", [False, True])
@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_usage_stripper_hides_what_the_client_did_not_ask_for(crlf: bool, step: int) -> None:
    upstream = _stream(
        [{"choices": [{"text": f"tok {i}"}], "usage": None} for i in range(20)]
        + [{"choices": [], "usage": USAGE}],
        crlf,
    )
    stripper = UsageStripper()
    out = b"".join(
        stripper.feed(upstream[start : start + step]) for start in range(0, len(upstream), step)
    )
    out += stripper.flush()
    # Exactly what a worker sends without include_usage, byte for byte.
    assert out == _stream([{"choices": [{"text": f"tok {i}"}]} for i in range(20)], crlf)
    assert stripper.usage == Usage(prompt=40, completion=8, cached=32)


@pytest.mark.parametrize("crlf", [False, True])
def test_usage_stripper_on_a_whole_stream_in_one_chunk(crlf: bool) -> None:
    # A relay that lags gets many events in one read: those before the usage event
    # pass unchanged, the usage-only event is held back, the end marker follows.
    content = [{"choices": [{"text": f"tok {i}"}]} for i in range(16)]
    upstream = _stream([*content, {"choices": [], "usage": USAGE}], crlf)
    stripper = UsageStripper()
    out = stripper.feed(upstream[:-5]) + stripper.feed(upstream[-5:]) + stripper.flush()
    assert out == _stream(content, crlf)
    assert stripper.usage == Usage(prompt=40, completion=8, cached=32)
    whole = UsageStripper()
    assert whole.feed(upstream) + whole.flush() == _stream(content, crlf)


@pytest.mark.parametrize("null_usage", [False, True])
@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_usage_stripper_sees_a_turn_end_in_a_tool_call(null_usage: bool, step: int) -> None:
    """With or without the ``"usage": null`` some workers put on every event."""
    extra = {"usage": None} if null_usage else {}
    events: list[object] = [
        {"choices": [{"delta": {"content": f"t{i}"}}], **extra} for i in range(4)
    ]
    call = {"choices": [{"delta": {}, "finish_reason": "tool_calls"}], **extra}
    for finish, called in ((call, True), ({**call, "choices": [{"finish_reason": "stop"}]}, False)):
        upstream = _stream([*events, finish, {"choices": [], "usage": USAGE}])
        stripper = UsageStripper()
        for start in range(0, len(upstream), step):
            stripper.feed(upstream[start : start + step])
        stripper.flush()
        assert (stripper.tool_call, stripper.usage) == (called, Usage(40, 8, 32))


def test_usage_stripper_passes_other_events_unchanged() -> None:
    stripper = UsageStripper()
    text = _event({"choices": [{"text": 'the word "usage" in quotes'}]})
    assert stripper.feed(text) == text
    assert stripper.feed(b": keep-alive comment\n\n") == b": keep-alive comment\n\n"
    assert stripper.feed(b'data: not json, mentions "usage"') == b""  # held: incomplete
    assert stripper.flush() == b'data: not json, mentions "usage"'
    assert stripper.usage is None


@pytest.mark.parametrize(
    "payload",
    [
        {"model": "m", "stream": True},
        {"model": "m", "stream": True, "stream_options": {"include_usage": False}},
        {"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": True}},
    ],
)
def test_with_stream_usage_asks_for_usage_and_keeps_the_rest(payload: dict[str, Any]) -> None:
    assert not client_wants_stream_usage(payload)
    asked = json.loads(with_stream_usage(json.dumps(payload).encode(), payload))
    assert client_wants_stream_usage(asked)
    assert {k: v for k, v in asked.items() if k != "stream_options"} == {
        k: v for k, v in payload.items() if k != "stream_options"
    }
    extra = {k: v for k, v in (payload.get("stream_options") or {}).items()}
    extra["include_usage"] = True
    assert asked["stream_options"] == extra


@pytest.mark.parametrize("crlf", [False, True])
@pytest.mark.parametrize("step", [1, 5, 33, 10_000])
def test_usage_stripper_forwards_whole_events_only_and_each_at_once(crlf: bool, step: int) -> None:
    # The relay keeps no tail behind a stripper: what it forwards must always end on
    # an event boundary (so a broken stream's error event needs no separator), and an
    # event completed by a read goes out with that read, split across reads or not.
    upstream = _stream(
        [{"choices": [{"text": f"tok {i}"}], "usage": None} for i in range(12)]
        + [{"choices": [], "usage": USAGE}],
        crlf,
    )
    end = b"\r\n\r\n" if crlf else b"\n\n"
    stripper = UsageStripper()
    forwarded = 0
    for start in range(0, len(upstream), step):
        piece = stripper.feed(upstream[start : start + step])
        if piece:
            assert piece.endswith(end)
        forwarded += piece.count(b"data: {")
        # Every content event wholly received by now has been forwarded (the 13th
        # event is the usage-only one, held back; the 14th is [DONE]).
        assert forwarded == min(upstream[: start + step].count(end), 12)
    assert stripper.flush() == b""
    assert stripper.usage == Usage(prompt=40, completion=8, cached=32)
