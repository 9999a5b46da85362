"""Simulated requests as OpenAI request bodies: real prompt text, deterministically.

A segment becomes ``kvgate.workload.text.segment_text`` of ``tokens *
chars_per_token`` characters (same id, same text), so prompts that share
segments share text prefixes, as the simulator assumes.

Chat-style requests (``opening > 0``) become ``/v1/chat/completions`` messages
in one fixed layout: the first segment is the system message, the rest of the
opening is one user message, and the segments after the opening alternate
assistant (a previous turn's reply) and user (the new turn). A reply is sent as
the text the target actually answered, as a real chat client does, so an engine
that caches its own output hits it on the next turn; when that answer is not
known (the turn failed) the reply segment's pseudo-text stands in. Requests
without an opening (traces) become ``/v1/completions`` prompts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.types import Priority
from kvgate.workload.request import Segment, SimRequest
from kvgate.workload.text import CHARS_PER_TOKEN, segment_text

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


TOOL = {"name": "run", "description": "Run a command", "parameters": {"type": "object"}}
"""The tool an agent's turn calls (one, so the turn's tokens are those of its context)."""

PARENT_HEADER = "X-Dynamo-Parent-Session-ID"
"""How a subagent's requests name their parent session (NVIDIA Dynamo's header)."""


@dataclass(frozen=True, slots=True)
class Payload:
    """One request ready to send: the endpoint path, the JSON body and the headers."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def chat(self) -> bool:
        """True for ``/v1/chat/completions`` (its stream carries ``delta.content``)."""
        return self.path == CHAT_PATH


class PayloadBuilder:
    """Builds request bodies for one target model; texts are memoised per segment.

    ``session_header`` carries ``SimRequest.session_id`` when the workload has one,
    ``priority_header`` a priority other than standard.
    """

    def __init__(
        self,
        model: str,
        *,
        chars_per_token: int = CHARS_PER_TOKEN,
        session_header: str = "X-Session-ID",
        priority_header: str = "X-Priority",
        memo_limit: int = 50_000,
    ) -> None:
        if chars_per_token < 1:
            raise ValueError("chars_per_token must be >= 1")
        self.model = model
        self.chars_per_token = chars_per_token
        self.session_header = session_header
        self.priority_header = priority_header
        self._memo: dict[Segment, str] = {}
        self._memo_limit = memo_limit

    def text(self, segment: Segment) -> str:
        """The pseudo-text of one segment."""
        found = self._memo.get(segment)
        if found is None:
            found = segment_text(segment[0], segment[1] * self.chars_per_token)
            if len(self._memo) >= self._memo_limit:
                self._memo.clear()  # the text is a pure function of the segment
            self._memo[segment] = found
        return found

    def messages(
        self, request: SimRequest, replies: Mapping[int, str] | None = None
    ) -> list[dict[str, str]]:
        """The chat messages of a request with an opening (see the module docstring)."""
        replies = replies or {}
        segments = request.segments
        opening = max(1, min(request.opening, len(segments)))
        messages = [{"role": "system", "content": self.text(segments[0])}]
        if opening > 1:
            user = "".join(self.text(s) for s in segments[1:opening])
            messages.append({"role": "user", "content": user})
        for i, segment in enumerate(segments[opening:]):
            if i % 2 == 0:
                content = replies.get(segment[0])
                if content is None:
                    content = self.text(segment)
                messages.append({"role": "assistant", "content": content})
            else:
                messages.append({"role": "user", "content": self.text(segment)})
        return messages

    def prompt(self, request: SimRequest) -> str:
        """The completion prompt of a request without an opening: its segments' texts."""
        return "".join(self.text(s) for s in request.segments)

    def payload(self, request: SimRequest, replies: Mapping[int, str] | None = None) -> Payload:
        """The streamed request for ``request``, asking for usage in the last chunk."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.opening > 0:
            path = CHAT_PATH
            body["messages"] = self.messages(request, replies)
        else:
            path = COMPLETIONS_PATH
            body["prompt"] = self.prompt(request)
        if (request.tool_call or request.returning) and path == CHAT_PATH:
            # An agent's turns all carry its tools; one that ends calling a tool forces
            # it, so the worker answers ``finish_reason: tool_calls`` (the emulated one
            # obeys a forced choice), as an agent's turns end before it runs one.
            body["tools"] = [{"type": "function", "function": TOOL}]
            body["tool_choice"] = "required" if request.tool_call else "none"
        headers = {}
        if request.session_id is not None:
            headers[self.session_header] = request.session_id
        if request.parent_session is not None:
            headers[PARENT_HEADER] = request.parent_session
        if request.priority is not Priority.STANDARD:
            headers[self.priority_header] = request.priority.name.lower()
        return Payload(path, body, headers)
