"""The Messages API's conversation hashes as the same conversation sent as chat."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvgate.core.messages import as_chat, canonical_json, stop_is_tool_call
from kvgate.core.prefix import FeatureConfig, InvalidRequestError, build_features
from kvgate.types import SessionSource

TOOLS_CHAT = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
TOOLS_MESSAGES = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {"properties": {"path": {"type": "string"}}, "type": "object"},
    }
]

CHAT: dict[str, Any] = {
    "model": "demo",
    "tools": TOOLS_CHAT,
    "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the bug."},
        {
            "role": "assistant",
            "content": "Reading it.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    # As a model writes it: spaces, its own key order.
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "print(1)"},
        {"role": "user", "content": "Go on."},
    ],
}
MESSAGES: dict[str, Any] = {
    "model": "demo",
    "max_tokens": 64,
    "system": [{"type": "text", "text": "You are a coding agent."}],
    "tools": TOOLS_MESSAGES,
    "messages": [
        {"role": "user", "content": "Fix the bug."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "text", "text": "Reading it."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "read_file",
                    "input": {"path": "a.py"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "print(1)"},
                {"type": "text", "text": "Go on."},
            ],
        },
    ],
}


def _features(body: dict[str, Any], endpoint: str, **headers: str) -> Any:
    return build_features(body, headers, request_id="r", endpoint=endpoint)  # type: ignore[arg-type]


def test_the_same_conversation_has_the_same_chain_whichever_api_sends_it() -> None:
    chat = _features(CHAT, "chat")
    messages = _features(MESSAGES, "messages")
    assert messages.prefix_hashes == chat.prefix_hashes
    assert messages.prompt_chars == chat.prompt_chars
    assert messages.max_tokens == 64


def test_tools_are_part_of_the_chain_and_come_first() -> None:
    plain = _features({**CHAT, "tools": None}, "chat")
    other = [{**TOOLS_CHAT[0], "function": {**TOOLS_CHAT[0]["function"], "name": "write"}}]
    changed = _features({**CHAT, "tools": other}, "chat")
    with_tools = _features(CHAT, "chat")
    assert plain.prefix_hashes[0] != with_tools.prefix_hashes[0]
    assert changed.prefix_hashes[0] != with_tools.prefix_hashes[0]


def test_a_later_turn_extends_the_earlier_turns_chain_across_apis() -> None:
    first = {**MESSAGES, "messages": MESSAGES["messages"][:1]}
    small = FeatureConfig(block_chars=8)
    earlier = build_features(first, {}, small, request_id="r", endpoint="messages")
    later = build_features(CHAT, {}, small, request_id="r", endpoint="chat")
    blocks = len(earlier.prefix_hashes) - 1  # the last (partial) block differs
    assert blocks > 0
    assert later.prefix_hashes[:blocks] == earlier.prefix_hashes[:blocks]


def test_tool_results_become_tool_messages_before_the_users_text() -> None:
    chat, tools = as_chat(MESSAGES)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "user"]
    assert chat[2]["tool_calls"][0]["function"]["arguments"] == '{"path":"a.py"}'
    assert tools[0]["function"]["parameters"]["type"] == "object"


def test_canonical_json_reads_json_text_and_sorts_keys() -> None:
    assert canonical_json('{"b": 1, "a": [1, 2]}') == '{"a":[1,2],"b":1}'
    assert canonical_json({"b": 1, "a": 2}) == json.dumps({"a": 2, "b": 1}, separators=(",", ":"))
    assert canonical_json("not json") == "not json"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "demo", "messages": []}, "messages"),
        ({"model": "demo", "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"model": "demo", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"model": "demo", "system": 5, "messages": [{"role": "user", "content": "x"}]}, "system"),
        ({"model": "demo", "tools": {}, "messages": [{"role": "user", "content": "x"}]}, "tools"),
    ],
)
def test_a_malformed_messages_body_is_refused_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        _features(body, "messages")
    assert caught.value.param == param


def test_metadata_user_id_is_the_messages_apis_user_field() -> None:
    found = _features({**MESSAGES, "metadata": {"user_id": "u-7"}}, "messages")
    assert (found.session_key, found.session_source) == ("u-7", SessionSource.USER)


@pytest.mark.parametrize(
    "header", ["x-claude-code-session-id", "X-Claude-Code-Session-Id", "session_id", "session-id"]
)
def test_an_agent_clis_identity_header_is_the_session(header: str) -> None:
    found = build_features(CHAT, {header: " s-1 "}, request_id="r")
    assert (found.session_key, found.session_source) == ("s-1", SessionSource.AGENT)


def test_the_configured_session_header_wins_over_an_agents_and_the_list_is_configurable() -> None:
    both = {"X-Session-ID": "mine", "x-claude-code-session-id": "agent"}
    assert build_features(CHAT, both, request_id="r").session_key == "mine"
    off = FeatureConfig(agent_session_headers=())
    assert build_features(CHAT, {"session_id": "a"}, off, request_id="r").session_key is None
    custom = FeatureConfig(agent_session_headers=("X-My-Agent",))
    assert build_features(CHAT, {"x-my-agent": "a"}, custom, request_id="r").session_key == "a"


@pytest.mark.parametrize(
    "header",
    [
        "X-Dynamo-Parent-Session-ID",
        "x-claude-code-parent-agent-id",
        "x-codex-parent-thread-id",
        "x-parent-session-id",
    ],
)
def test_a_subagent_names_its_parent(header: str) -> None:
    found = build_features(CHAT, {"session_id": "child", header: "parent"}, request_id="r")
    assert (found.session_key, found.parent_key) == ("child", "parent")
    assert build_features(CHAT, {}, request_id="r").parent_key is None


def test_tool_stops_of_both_apis() -> None:
    assert stop_is_tool_call("tool_calls") and stop_is_tool_call("tool_use")
    assert not stop_is_tool_call("stop") and not stop_is_tool_call(None)
