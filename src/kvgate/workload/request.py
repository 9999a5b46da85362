"""The simulator's request record: arrival time, prompt structure and output length.

A prompt is a sequence of *segments* ``(segment_id, tokens)``: a system prompt, a
document, a chat turn, one Mooncake 512-token block. Two prompts share a cached
prefix exactly as far as their segment sequences agree; ``kvgate.workload.prompts``
cuts segments into engine blocks and into the gateway's text blocks.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import TypeVar

from kvgate.types import Priority, Seconds

T = TypeVar("T")

Segment = tuple[int, int]
"""``(segment_id, tokens)``: one piece of prompt content; same id, same content."""


@dataclass(slots=True)
class SimRequest:
    """One request as a workload or trace produces it, in arrival order.

    ``opening`` is how many leading segments form the conversation's opening (the
    system prompt and first user message, from which the gateway derives a session
    key when the client sends none); 0 means a completions-style prompt, keyed by
    its first characters. ``reply`` is the segment the engine's output becomes in
    the next turn's prompt, when a next turn will re-send it. ``conversation`` names
    the conversation a generator made the request a turn of, whether or not a session
    id is sent (``None``: not known, as for one-shot traffic or a trace without session
    ids); only diagnostics read it (``workload.misses``), never the gateway.
    """

    arrival: Seconds
    request_id: str
    segments: tuple[Segment, ...]
    prompt_tokens: int
    max_tokens: int
    session_id: str | None = None
    priority: Priority = Priority.STANDARD
    opening: int = 0
    reply: Segment | None = None
    conversation: str | None = None
    tool_call: bool = False
    """The turn ends calling a tool (an agent's): its session comes back with the result."""
    returning: bool = False
    """The turn brings a tool's result back: its session's earlier turn ended in a tool call."""
    parent_session: str | None = None
    """A subagent's parent session (sent as ``X-Dynamo-Parent-Session-ID``)."""

    @classmethod
    def of(
        cls,
        arrival: Seconds,
        request_id: str,
        segments: tuple[Segment, ...],
        max_tokens: int,
        *,
        session_id: str | None = None,
        priority: Priority = Priority.STANDARD,
        opening: int = 0,
        reply: Segment | None = None,
        conversation: str | None = None,
        tool_call: bool = False,
        returning: bool = False,
        parent_session: str | None = None,
    ) -> SimRequest:
        """A request whose prompt length is the sum of its segments' tokens."""
        return cls(
            arrival=arrival,
            request_id=request_id,
            segments=segments,
            prompt_tokens=sum(tokens for _, tokens in segments),
            max_tokens=max(1, max_tokens),
            session_id=session_id,
            priority=priority,
            opening=opening,
            reply=reply,
            conversation=conversation,
            tool_call=tool_call,
            returning=returning,
            parent_session=parent_session,
        )


def previous_turn(request: SimRequest, pending: MutableMapping[int, T]) -> T | None:
    """What ``pending`` holds for a reply ``request`` re-sends (by reply segment id), taken
    out of it: the unended turn a client must wait for before sending ``request``. The
    live replay and the simulator's clients link turns by this one rule."""
    found = None
    for segment, _ in request.segments:
        waited = pending.pop(segment, None)
        if waited is not None:
            found = waited
    return found
