"""Warm-ups: a shared prefix computed ahead on an idle worker, off any client's path.

``default`` (its ``warm_min_blocks`` option) asks, after each placement, whether
the next conversation opening behind a shared prefix the worker holds would now
be sent to a worker that lacks it. Such a copy costs that opening a cold prefill
of the whole prefix, which is what sets a short run's p99. When that worker is
idle, the gateway sends it the prefix alone, as a one-token request, so the copy
is made before anyone waits for it (``WarmUp``). The policy counts the warm-up
in the worker's queue and index like a request (``on_warm``, ``on_warm_done``).

A warm-up's body is the opening request's own, cut at the prefix
(``warm_up_payload``): for chat, its leading messages with the last one's text
cut where the prefix ends, so the worker's chat template renders the same
leading tokens; for completions, the prompt's leading characters. A prefix that
does not end in plain text (an image, a tool call, a token-id prompt) is not
warmed: the cut could not be made exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.core.features import RequestFeatures
from kvgate.core.prefix import MESSAGE_SEP, ROLE_SEP, Endpoint
from kvgate.types import WorkerId

WARM_UP_MAX_TOKENS = 1
"""A warm-up asks for one token: its work is the prefill."""


@dataclass(frozen=True, slots=True)
class WarmUp:
    """Send the leading ``features.prompt_chars`` characters of request ``opener``'s
    prompt to ``worker`` (``features``: that prefix, as the policy indexes it)."""

    worker: WorkerId
    features: RequestFeatures
    opener: str


def warm_up_payload(
    payload: Mapping[str, Any], endpoint: Endpoint, chars: int
) -> dict[str, Any] | None:
    """The body of a warm-up of ``payload``'s first ``chars`` canonical characters
    (``core.prefix``); ``None`` when the prefix cannot be cut out exactly."""
    if chars <= 0:
        return None
    body: dict[str, Any] = {
        "model": payload.get("model"),
        "max_tokens": WARM_UP_MAX_TOKENS,
        "stream": False,
    }
    if endpoint == "completions":
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str) or chars > len(prompt):
            return None
        body["prompt"] = prompt[:chars]
        return body
    messages = _leading_messages(payload.get("messages"), chars)
    if messages is None:
        return None
    body["messages"] = messages
    return body


def _leading_messages(messages: object, chars: int) -> list[dict[str, Any]] | None:
    """The messages whose canonical text (``role ROLE_SEP text MESSAGE_SEP``) covers the
    first ``chars`` characters, the last one's text cut there."""
    if not isinstance(messages, list):
        return None
    out: list[dict[str, Any]] = []
    left = chars
    for message in messages:
        if not isinstance(message, dict):
            return None
        role, text = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(text, str) or message.get("tool_calls"):
            return None
        head = len(role) + len(ROLE_SEP)
        size = head + len(text) + len(MESSAGE_SEP)
        if left >= size:
            out.append({"role": role, "content": text})
            left -= size
            if not left:
                return out
            continue
        if left <= head:
            return out or None  # the cut falls in the role: the whole messages before it
        out.append({"role": role, "content": text[: left - head]})
        return out
    return out or None
