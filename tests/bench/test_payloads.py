"""Simulated requests as OpenAI bodies: same segment, same text; shared segments, shared prefix."""

from __future__ import annotations

import itertools

from kvgate.bench.payloads import CHAT_PATH, COMPLETIONS_PATH, PayloadBuilder
from kvgate.workload.prompts import segment_text
from kvgate.workload.request import SimRequest
from kvgate.workload.synthetic import build_workload


def test_segment_text_is_the_sims_pseudo_text_at_the_given_ratio() -> None:
    builder = PayloadBuilder("m", chars_per_token=3)
    assert builder.text((7, 10)) == segment_text(7, 30)
    assert builder.text((7, 10)) == PayloadBuilder("other", chars_per_token=3).text((7, 10))
    assert builder.text((8, 10)) != builder.text((7, 10))


def test_chat_layout_system_user_then_alternating_assistant_user() -> None:
    request = SimRequest.of(
        0.0, "r0", ((0, 5), (1, 4), (2, 3), (3, 4), (4, 3), (5, 4)), 8, opening=2, session_id="s"
    )
    builder = PayloadBuilder("m")
    payload = builder.payload(request, {2: "first answer"})
    roles = [m["role"] for m in payload.body["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    contents = [m["content"] for m in payload.body["messages"]]
    # A known reply is sent as answered; an unknown one as the segment's pseudo-text.
    assert contents[2] == "first answer"
    assert contents[4] == builder.text((4, 3))
    assert payload.path == CHAT_PATH
    assert payload.headers == {"X-Session-ID": "s"}
    assert payload.body["stream_options"] == {"include_usage": True}
    assert payload.body["max_tokens"] == 8


def test_opening_segments_after_the_system_prompt_form_one_user_message() -> None:
    request = SimRequest.of(0.0, "r0", ((0, 5), (9, 20), (10, 3)), 4, opening=3)
    builder = PayloadBuilder("m")
    messages = builder.messages(request)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == builder.text((9, 20)) + builder.text((10, 3))


def test_requests_without_opening_are_completions_without_session_header() -> None:
    request = SimRequest.of(0.0, "r0", ((5, 4), (6, 2)), 3)
    builder = PayloadBuilder("m")
    payload = builder.payload(request)
    assert payload.path == COMPLETIONS_PATH
    assert payload.body["prompt"] == builder.text((5, 4)) + builder.text((6, 2))
    assert payload.headers == {}


def test_a_sessions_turns_extend_the_previous_turns_messages() -> None:
    workload = build_workload("chat:turns_mean=4,session_ids=true", seed=2)
    builder = PayloadBuilder("m")
    by_session: dict[str, list[list[dict[str, str]]]] = {}
    for request in itertools.islice(workload.requests(), 60):
        assert request.session_id is not None
        by_session.setdefault(request.session_id, []).append(builder.messages(request))
    multi = [turns for turns in by_session.values() if len(turns) > 1]
    assert multi, "the workload should contain multi-turn sessions"
    for turns in multi:
        for earlier, later in itertools.pairwise(turns):
            assert later[: len(earlier)] == earlier
    systems = {turns[0][0]["content"] for turns in by_session.values()}
    assert len(systems) == 1  # one system prompt shared by every session
