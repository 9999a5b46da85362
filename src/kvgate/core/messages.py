"""Anthropic's Messages API read as the chat conversation it is.

A ``POST /v1/messages`` body holds the same conversation a chat completion does, in
other words: a top-level ``system``, ``messages`` whose content is blocks (``text``,
``image``, ``tool_use`` on the assistant's side, ``tool_result`` on the user's), and
``tools`` with an ``input_schema``. ``as_chat`` rewrites it as OpenAI chat messages and
tools, so routing hashes one canonical text for one conversation whichever API sends
it (``core.prefix.chat_canonical_pieces``), and the emulated worker renders it
through the same template: a conversation that switches API keeps its worker and its
cache.

The rewriting follows what OpenAI-compatible engines do with the Messages API: a
``tool_use`` block becomes an assistant ``tool_calls`` entry whose ``arguments`` is
the JSON of its ``input``; each ``tool_result`` block becomes a ``tool`` message, before
the user's text of the same message; ``thinking`` blocks are dropped (chat carries
none). Both sides' tool-call arguments are hashed as canonical JSON, so the text a
client sent either way hashes alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ChatView",
    "MessagesShapeError",
    "as_chat",
    "canonical_json",
    "stop_is_tool_call",
    "user_id",
]

ChatView = tuple[list[dict[str, Any]], list[dict[str, Any]]]
"""Chat messages and chat tools (``{"type": "function", "function": {...}}``)."""


class MessagesShapeError(ValueError):
    """The Messages body has the wrong shape (``param`` names the field)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def canonical_json(value: object) -> str:
    """``value`` as compact JSON with sorted keys; a string holding JSON is read first.

    A chat tool call's ``arguments`` is a JSON string (as the model wrote it); a Messages
    ``tool_use`` input is an object: both hash as this text.
    """
    if isinstance(value, str):
        text = value
        try:
            value = json.loads(text)
        except ValueError:
            return text
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def _text_of(content: object, param: str) -> str | list[dict[str, Any]]:
    """A ``system`` or ``tool_result`` content as chat content (text, or parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise MessagesShapeError("content must be a string or a list of blocks", param)
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        if not isinstance(block, dict):
            raise MessagesShapeError("each content block must be an object", f"{param}[{j}]")
        parts.append(_part(block, f"{param}[{j}]"))
    if all(p.get("type") == "text" for p in parts):
        return "\n".join(str(p["text"]) for p in parts)
    return parts


def _part(block: Mapping[str, Any], param: str) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str):
            raise MessagesShapeError("a text block needs a string 'text'", f"{param}.text")
        return {"type": "text", "text": text}
    # An image (or document) changes the KV the engine computes: a marker of its source.
    return {"type": str(kind), str(kind): block.get("source", dict(block))}


def _user(content: list[Any], param: str) -> list[dict[str, Any]]:
    """A user message's blocks: one ``tool`` message per result, then the rest as a user's."""
    out: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(block, dict):
            raise MessagesShapeError("each content block must be an object", where)
        if block.get("type") == "tool_result":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": str(block.get("tool_use_id", "")),
                    "content": _text_of(block.get("content"), f"{where}.content"),
                }
            )
        elif block.get("type") not in ("thinking", "redacted_thinking"):
            rest.append(_part(block, where))
    if rest:
        if all(p["type"] == "text" for p in rest):
            out.append({"role": "user", "content": "\n".join(p["text"] for p in rest)})
        else:
            out.append({"role": "user", "content": rest})
    return out


def _assistant(content: list[Any], param: str) -> dict[str, Any]:
    """An assistant message's blocks: its text, and its ``tool_use`` blocks as tool calls."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(block, dict):
            raise MessagesShapeError("each content block must be an object", where)
        kind = block.get("type")
        if kind == "text":
            texts.append(str(_part(block, where)["text"]))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name", "")),
                        "arguments": canonical_json(block.get("input", {})),
                    },
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def as_chat(body: Mapping[str, Any]) -> ChatView:
    """The Messages body's conversation as chat messages and chat tools.

    Raises ``MessagesShapeError`` on a malformed ``system``, ``messages`` or ``tools``.
    """
    chat: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = _text_of(system, "system")
        if text:
            chat.append({"role": "system", "content": text})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MessagesShapeError("'messages' must be a non-empty list", "messages")
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise MessagesShapeError("each message must be an object", param)
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise MessagesShapeError("a message's role is 'user' or 'assistant'", f"{param}.role")
        content = message.get("content")
        if isinstance(content, str):
            chat.append({"role": role, "content": content})
        elif not isinstance(content, list):
            raise MessagesShapeError(
                "content must be a string or a list of blocks", f"{param}.content"
            )
        elif role == "user":
            chat.extend(_user(content, f"{param}.content"))
        else:
            chat.append(_assistant(content, f"{param}.content"))
    return chat, _tools(body.get("tools"))


def _tools(tools: object) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise MessagesShapeError("'tools' must be a list", "tools")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise MessagesShapeError("each tool must be an object", f"tools[{i}]")
        function: dict[str, Any] = {"name": str(tool.get("name", ""))}
        if "description" in tool:
            function["description"] = tool["description"]
        # A server tool (web search, ...) has a type and no schema: its config is its text.
        function["parameters"] = tool.get("input_schema", {k: v for k, v in tool.items()})
        out.append({"type": "function", "function": function})
    return out


def user_id(body: Mapping[str, Any]) -> str | None:
    """``metadata.user_id``: the Messages API's counterpart of chat's ``user`` field."""
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        value = metadata.get("user_id")
        if isinstance(value, str):
            return value
    return None


TOOL_STOPS = frozenset({"tool_calls", "tool_use", "function_call"})
"""Finish (chat) and stop (Messages) reasons that end a turn in a tool call."""


def stop_is_tool_call(reason: str | None) -> bool:
    """True when a turn's finish or stop reason says it ended calling a tool."""
    return reason in TOOL_STOPS
