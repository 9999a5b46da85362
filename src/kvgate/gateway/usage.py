"""Reading OpenAI ``usage`` out of responses without slowing them down.

Streams are forwarded chunk by chunk; the tap only keeps a bounded tail of the
bytes already sent and, once the stream ends, looks for the last server-sent
event that carries a non-null ``usage``. Nothing is parsed while forwarding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_TAIL_KEEP = 16 * 1024
_TAIL_MAX = 64 * 1024


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts from one response's ``usage`` (``cached`` from prompt_tokens_details)."""

    prompt: int
    completion: int
    cached: int


def usage_from(payload: object) -> Usage | None:
    """The ``usage`` of a decoded OpenAI response object, if it has a valid one."""
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    details: Any = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(prompt, completion, cached if isinstance(cached, int) else 0)


def usage_from_body(body: bytes) -> Usage | None:
    """The ``usage`` of a whole (non-streaming) JSON response body."""
    if b'"usage"' not in body:
        return None
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

    def usage(self) -> Usage | None:
        """The last non-null ``usage`` among the kept events, if any."""
        tail = bytes(self._tail)
        if b'"usage"' not in tail:
            return None
        for event in reversed(tail.replace(b"\r\n", b"\n").split(b"\n\n")):
            if b'"usage"' not in event:
                continue
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    continue
                try:
                    found = usage_from(json.loads(data))
                except ValueError:
                    continue
                if found is not None:
                    return found
        return None
