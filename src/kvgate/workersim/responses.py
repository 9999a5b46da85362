"""OpenAI response bodies and stream chunks, and the filler text they carry.

Shapes follow OpenAI's API exactly (``chat.completion``, ``chat.completion.chunk``,
``text_completion``) so the official client parses them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from kvgate.engine.tokenizer import tokenize

Endpoint = Literal["chat", "completion"]

# Words of at most four letters are one token each for the engine's tokenizer, so
# the text's token count is the engine's output token count.
_FILLER = (
    "the", "kv", "pool", "is", "warm", "so", "this", "turn", "runs", "fast", "and",
    "each", "new", "word", "adds", "one", "more", "tok", "to", "its", "page",
)  # fmt: skip


_WORD_CHAR = re.compile(r"\w")
_BARE_IDS = tuple(tokenize(word)[0] for word in _FILLER)
_LEAD_IDS = tuple(tokenize(f" {word}")[0] for word in _FILLER)


def filler_tokens(count: int, after: str) -> list[int] | None:
    """Token ids of ``filler(0, count)`` when it follows the text ``after``.

    Equal to the tail of ``tokenize(after + filler(0, count))`` without tokenizing
    again; ``None`` when the first word would merge with a word ending ``after``.
    """
    if count < 1:
        return []
    last = after[-1:] if after else ""
    if last and _WORD_CHAR.match(last):
        return None
    size = len(_FILLER)
    first = (_LEAD_IDS if last.isspace() else _BARE_IDS)[0]
    return [first, *(_LEAD_IDS[i % size] for i in range(1, count))]


def filler(start: int, count: int) -> str:
    """Output tokens ``start .. start+count`` as text: one word per token, space-separated."""
    size = len(_FILLER)
    return "".join(
        f" {_FILLER[i % size]}" if i else _FILLER[0] for i in range(start, start + count)
    )


@dataclass(frozen=True, slots=True)
class Usage:
    """Token accounting of one request, as the engine reported it."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    ttft_s: float | None = None
    e2e_s: float | None = None
    worker: str | None = None
    """Who served it (the emulated worker's GPU UUID), so a benchmark can tell which worker
    answered behind any router, not only one that names it in a header."""

    def body(self) -> dict[str, Any]:
        """OpenAI's ``usage`` object, plus the engine's own timing when known.

        ``kvgate_timing`` holds the time to first token and end-to-end latency
        the engine measured, in model seconds (queue wait + prefill, as a real
        engine's own histograms record them), and who served it (``worker``). A
        benchmark on a crowded machine reads these beside its wall-clock figures:
        they are what routing changes, free of the harness's CPU contention, and
        they name the worker behind any router. OpenAI clients ignore the extra
        key.
        """
        body: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }
        if self.ttft_s is not None and self.e2e_s is not None:
            body["kvgate_timing"] = {
                "ttft_s": round(self.ttft_s, 6),
                "e2e_s": round(self.e2e_s, 6),
            }
            if self.worker is not None:
                body["kvgate_timing"]["worker"] = self.worker
        return body


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    """What every body and chunk of one answer repeats."""

    id: str
    created: int
    model: str
    endpoint: Endpoint

    @property
    def object(self) -> str:
        """The ``object`` of a non-streamed answer."""
        return "chat.completion" if self.endpoint == "chat" else "text_completion"

    @property
    def chunk_object(self) -> str:
        """The ``object`` of a stream chunk (completions reuse ``text_completion``)."""
        return "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"

    def completion(
        self, text: str, finish_reason: str, usage: Usage, tool: str | None = None
    ) -> dict[str, Any]:
        """The whole non-streamed answer; with ``tool``, the turn ends calling it."""
        choice: dict[str, Any]
        if self.endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
            if tool is not None:
                message["tool_calls"] = [self.tool_call(tool, text)]
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [choice],
            "usage": usage.body(),
        }

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        role: bool = False,
        with_usage_field: bool = False,
    ) -> dict[str, Any]:
        """One stream chunk with one choice.

        ``role`` marks the chat stream's first chunk; ``with_usage_field`` adds
        ``"usage": null`` as OpenAI does on every chunk when usage was requested.
        """
        choice: dict[str, Any]
        if self.endpoint == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {
                "index": 0,
                "text": text or "",
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": self.chunk_object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [choice],
        }
        if with_usage_field:
            chunk["usage"] = None
        return chunk

    def tool_call(self, tool: str, text: str) -> dict[str, Any]:
        """The one tool call a turn forced to call ``tool`` ends with (its input: the text)."""
        arguments = json.dumps({"input": text})
        return {"id": "call_" + self.id[-12:], "type": "function",
                "function": {"name": tool, "arguments": arguments}}  # fmt: skip

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The final chunk of ``stream_options.include_usage``: no choices, only usage."""
        return {
            "id": self.id,
            "object": self.chunk_object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [],
            "usage": usage.body(),
        }


def sse_event(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
"""The event that ends every OpenAI stream."""
