"""Shared aliases and small enums that every part of kvgate imports.

Kept tiny and dependency-free so nothing imports in circles.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import TypeAlias

WorkerId: TypeAlias = str
"""A worker's identity: its base URL, e.g. ``http://127.0.0.1:8001``."""

SessionKey: TypeAlias = str
BlockHash: TypeAlias = int
Seconds: TypeAlias = float


class Priority(IntEnum):
    """Request priority classes (header ``X-Priority``); higher is more important.

    Shedding refuses ``SHEDDABLE`` first and ``CRITICAL`` last.
    """

    SHEDDABLE = 0
    STANDARD = 1
    CRITICAL = 2

    @classmethod
    def parse(cls, text: str | None, default: str = "standard") -> Priority:
        """Parse a header value; unknown or missing values mean ``default``."""
        if not text:
            if default == "standard":
                return _STANDARD  # not ``cls.STANDARD``: a slow ``EnumType`` lookup on 3.11
            return cls[default.upper()]
        try:
            return cls[text.strip().upper()]
        except KeyError:
            return cls[default.upper()]


_STANDARD = Priority.STANDARD


class SessionSource(StrEnum):
    """Where a request's session key came from."""

    HEADER = "header"
    AGENT = "agent"
    """An agent CLI's own session header (``x-claude-code-session-id``, Codex's ``session_id``)."""
    USER = "user"
    PREFIX = "prefix"
    CONTINUATION = "continuation"
    """A response id a worker answered with (``previous_response_id``): that worker holds
    the conversation's state, so the request must go back to it whatever the policy."""
    NONE = "none"
