"""Reading OpenAI ``usage`` out of responses without slowing them down.

Streams are forwarded chunk by chunk; the tap only keeps a bounded tail of the
bytes already sent and, once the stream ends, looks for the last server-sent
event that carries a non-null ``usage``. Nothing is parsed while forwarding.

A stream only carries usage when the client set ``stream_options.include_usage``.
When it did not, the gateway asks the worker anyway (``with_stream_usage``) and
forwards through a ``UsageStripper``, which hides what the client did not ask for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

_TAIL_KEEP = 16 * 1024
_TAIL_MAX = 64 * 1024

_TOOL_STOP = re.compile(rb'"(?:finish_reason|stop_reason)"\s*:\s*"(?:tool_calls|tool_use)"')
"""A turn that ends calling a tool: chat's ``finish_reason``, the Messages API's ``stop_reason``."""


def ends_in_tool_call(data: bytes) -> bool:
    """True when an answer (a whole body, or a stream's last events) ends in a tool call
    (a plain substring test first: most answers, some of them megabytes, call none)."""
    return b"tool_" in data and _TOOL_STOP.search(data) is not None


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts from one response's ``usage`` (``cached`` from prompt_tokens_details)."""

    prompt: int
    completion: int
    cached: int
    engine_ttft: float | None = None
    """The engine's own time to first token, where ``usage`` carries it (the emulated
    worker's ``kvgate_timing.ttft_s``, in its model seconds)."""


def usage_from(payload: object) -> Usage | None:
    """The ``usage`` of a decoded response object, if it has a valid one: OpenAI's chat and
    completions, its Responses API's, or Anthropic's Messages API's (``input_tokens`` past
    the cache, ``cache_read_input_tokens`` read from it)."""
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens", 0)
    details: Any = usage.get("prompt_tokens_details")
    if prompt is None and "input_tokens" in usage:
        prompt = usage.get("input_tokens")
        completion = usage.get("output_tokens", 0)
        if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
            # Anthropic's Messages API: ``input_tokens`` are those past the cache.
            read = usage.get("cache_read_input_tokens") or 0
            made = usage.get("cache_creation_input_tokens") or 0
            if not isinstance(prompt, int) or not isinstance(read, int):
                return None
            if not isinstance(completion, int) or not isinstance(made, int):
                return None
            return Usage(prompt + read + made, completion, read)
        details = usage.get("input_tokens_details")  # the Responses API's names
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    timing = usage.get("kvgate_timing")
    ttft = timing.get("ttft_s") if isinstance(timing, dict) else None
    engine_ttft = float(ttft) if isinstance(ttft, int | float) and ttft >= 0 else None
    return Usage(prompt, completion, cached if isinstance(cached, int) else 0, engine_ttft)


_OPENING_TYPES = frozenset({"message_start", "content_block_start", "ping"})
"""The Messages API's events before its first token."""


def opening_only(chunk: bytes) -> bool:
    """True when ``chunk`` holds only events sent before the first token: a chat stream's
    opening ``delta`` with the role and no content (the emulated worker sends it at once,
    as some servers do), the Messages API's ``message_start``. Such a chunk is not the
    time to first token. Anything else, or an event cut across chunks, is a token."""
    if b'"role"' not in chunk and b"message_start" not in chunk and b"ping" not in chunk:
        return False  # the common chunk, read without decoding
    seen = False
    for line in chunk.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        try:
            event = json.loads(line[5:])
        except ValueError:
            return False
        if not isinstance(event, dict):
            return False
        if event.get("type") in _OPENING_TYPES:
            seen = True
            continue
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices:
            return False
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict) or choice.get("finish_reason") is not None:
                return False
            if any(v for k, v in delta.items() if k != "role"):
                return False
        seen = True
    return seen


_USAGE_KEY = re.compile(rb'"usage"\s*:\s*')
_DECODER = json.JSONDecoder()


def usage_from_body(body: bytes) -> Usage | None:
    """The ``usage`` of a whole (non-streaming) JSON response body.

    Only the value of the last ``"usage"`` key is decoded (OpenAI servers put it
    after ``choices``, so the text before it is never parsed); the whole body is
    decoded only when that does not give a valid usage.
    """
    at = body.rfind(b'"usage"')
    if at < 0:
        return None
    key = _USAGE_KEY.match(body, at)
    if key is not None:
        try:
            value, _ = _DECODER.raw_decode(body[key.end() :].decode())
        except ValueError:
            pass
        else:
            found = usage_from({"usage": value})
            if found is not None:
                return found
    try:
        return usage_from(json.loads(body))
    except ValueError:
        return None


class StreamTap:
    """Keeps the tail of an SSE stream to find its final ``usage`` when it ends."""

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail = bytearray()

    def feed(self, chunk: bytes) -> None:
        """Remember ``chunk`` (already forwarded); only a bounded tail is kept."""
        tail = self._tail
        tail += chunk
        if len(tail) > _TAIL_MAX:
            del tail[:-_TAIL_KEEP]

    @property
    def at_event_boundary(self) -> bool:
        """True when what was forwarded so far ends with a whole event (or is nothing)."""
        tail = self._tail
        return not tail or tail.endswith(b"\n\n")

    def tool_call(self) -> bool:
        """True when the stream's kept events end its turn in a tool call."""
        return ends_in_tool_call(bytes(self._tail[-_TAIL_KEEP:]))

    def usage(self) -> Usage | None:
        """The last non-null ``usage`` among the kept events, if any."""
        for event in self._kept_events(b'"usage"'):
            for payload in _event_payloads(event):
                found = usage_from(payload)
                if found is not None:
                    return found
        return None

    def _kept_events(self, marker: bytes) -> Iterator[bytes]:
        """The kept events that hold ``marker``, newest first."""
        tail = bytes(self._tail)
        if marker not in tail:
            return
        for event in reversed(tail.replace(b"\r\n", b"\n").split(b"\n\n")):
            if marker in event:
                yield event


class MessagesTap(StreamTap):
    """A Messages API stream's usage: ``message_start`` holds the input's (``input_tokens``,
    ``cache_read_input_tokens``), the last ``message_delta`` the output's.

    The start event is read as it passes (it opens the stream, before any kept tail is
    cut); ``usage`` is known once a ``message_delta`` carrying usage arrived, as an OpenAI
    stream's is once its final event did.
    """

    __slots__ = ("_head", "_start")

    def __init__(self) -> None:
        super().__init__()
        self._head: bytearray | None = bytearray()
        self._start: dict[str, Any] = {}

    def feed(self, chunk: bytes) -> None:
        """Remember ``chunk``; read ``message_start``'s usage while it is in the head."""
        super().feed(chunk)
        head = self._head
        if head is None:
            return
        head += chunk
        end = _event_end(head)
        if end < 0 and len(head) <= _TAIL_KEEP:
            return
        for payload in _event_payloads(bytes(head[: end if end >= 0 else len(head)])):
            message = payload.get("message") if payload.get("type") == "message_start" else None
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self._start = usage
        self._head = None  # the start is the first event: one look

    def usage(self) -> Usage | None:
        """The stream's usage once a ``message_delta`` with usage arrived (``None`` before)."""
        for event in self._kept_events(b"message_delta"):
            for payload in _event_payloads(event):
                delta = payload.get("usage")
                if payload.get("type") == "message_delta" and isinstance(delta, dict):
                    merged = {**self._start, **{k: v for k, v in delta.items() if v is not None}}
                    merged.setdefault("cache_read_input_tokens", 0)  # Anthropic's counting
                    return usage_from({"usage": merged})
        return None


def _event_payloads(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects on the ``data:`` lines of SSE bytes (others skipped)."""
    found: list[dict[str, Any]] = []
    for line in data.replace(b"\r\n", b"\n").split(b"\n"):
        if line.startswith(b"data:"):
            try:
                payload = json.loads(line[5:])
            except ValueError:
                continue
            if isinstance(payload, dict):
                found.append(payload)
    return found


_NULL_USAGE = re.compile(rb',\s*"usage"\s*:\s*null|"usage"\s*:\s*null\s*,?')
"""``"usage": null``, with its comma: what a worker adds to every chunk once usage is asked.

Inside a JSON string a quote is escaped, so an unescaped ``"usage"`` is always a key."""


def _event_end(buf: bytearray | bytes, start: int = 0) -> int:
    """The index just past the first complete SSE event in ``buf``, or -1."""
    lf = buf.find(b"\n\n", start)
    crlf = buf.find(b"\r\n\r\n", start)
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf + 4
    return lf + 2 if lf >= 0 else -1


def _last_event_end(data: bytes, limit: int) -> int:
    """The index just past the last whole SSE event ending before ``limit`` (0: none)."""
    lf = data.rfind(b"\n\n", 0, limit)
    crlf = data.rfind(b"\r\n\r\n", 0, limit)
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


class UsageStripper:
    """Forwards an SSE stream whose ``usage`` the gateway asked for but the client did not.

    The worker was asked for ``stream_options.include_usage`` so the gateway learns
    the stream's ``cached_tokens``; the client gets the stream it asked for: the
    usage-only final event (empty ``choices``) is kept back (its usage remembered in
    ``usage``), and the ``"usage": null`` fields on other events are removed. All
    other bytes pass unchanged. Events are forwarded whole: a partial event waits
    for its end (upstream chunks almost always end on an event boundary).
    """

    __slots__ = ("_buf", "tool_call", "usage")

    def __init__(self) -> None:
        self._buf = bytearray()
        self.usage: Usage | None = None
        self.tool_call = False
        """The stream's turn ended in a tool call (its finish event said so, with or without
        the ``"usage": null`` vLLM and SGLang put on every event once usage is asked)."""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` (and of earlier partial events) to forward now."""
        buf = self._buf
        head = b""
        if not buf:
            at = chunk.find(b'"usage"')
            if at < 0 and chunk.endswith(b"\n\n"):
                if not self.tool_call:
                    self.tool_call = ends_in_tool_call(chunk)
                return chunk  # the common case: whole events, nothing to change
            # Whole events before the first "usage" pass as they are; only the rest is
            # cut into events (events coalesce into one chunk when the relay lags).
            cut = _last_event_end(chunk, at if at >= 0 else len(chunk))
            if cut:
                head, chunk = chunk[:cut], chunk[cut:]
                if not self.tool_call:
                    self.tool_call = ends_in_tool_call(head)
        buf += chunk
        out = bytearray()
        start = 0
        while (end := _event_end(buf, start)) >= 0:
            out += self._filter(bytes(buf[start:end]))
            start = end
        del buf[:start]
        return head + out if head else bytes(out)

    def flush(self) -> bytes:
        """What is left when the stream ends (an unterminated last event)."""
        rest = bytes(self._buf)
        self._buf.clear()
        return self._filter(rest) if rest else b""

    def _filter(self, event: bytes) -> bytes:
        if not self.tool_call:
            self.tool_call = ends_in_tool_call(event)
        if b'"usage"' not in event:
            return event
        stripped = _NULL_USAGE.sub(b"", event)
        if b'"usage"' not in stripped:
            return stripped  # only null usage, on every content event: no JSON to decode
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            try:
                payload = json.loads(line[5:])
            except ValueError:
                return event
            found = usage_from(payload)
            if found is None:
                break
            self.usage = found
            if isinstance(payload, dict) and payload.get("choices") == []:
                return b""  # the usage-only event the client did not ask for
            return event  # usage riding on a content event: the worker sends it anyway
        return _NULL_USAGE.sub(b"", event)


def client_wants_stream_usage(payload: Mapping[str, Any]) -> bool:
    """True when a streaming request's ``stream_options.include_usage`` is set."""
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def with_stream_usage(body: bytes, payload: Mapping[str, Any]) -> bytes:
    """``body`` (the JSON of ``payload``) asking for ``stream_options.include_usage``.

    When the client sent no ``stream_options`` the field is spliced in front of its
    bytes, which are otherwise left as they were; else the body is re-encoded.
    """
    if "stream_options" not in payload:
        head = body.lstrip()
        if head.startswith(b"{") and not head[1:].lstrip().startswith(b"}"):
            return b'{"stream_options":{"include_usage":true},' + head[1:]
    options = payload.get("stream_options")
    merged = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps({**payload, "stream_options": merged}).encode()
