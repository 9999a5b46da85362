"""Session keys: which earlier requests a request belongs with.

First found wins: a configured header (default ``X-Session-ID``), then the
identity headers agent CLIs send on every request (``AGENT_SESSION_HEADERS``:
Claude Code's ``x-claude-code-session-id``, Codex's ``session_id``, ...), then the
OpenAI ``user`` field (can be turned off), then none. Over-long keys are hashed
so a client cannot make the affinity store hold arbitrarily large keys.

A subagent names its parent (``PARENT_SESSION_HEADERS``: Dynamo's
``X-Dynamo-Parent-Session-ID``, Claude Code's ``x-claude-code-parent-agent-id``,
Codex's ``x-codex-parent-thread-id``): ``parent_key_from`` reads it, and routing
places the subagent under its parent's binding until it has its own
(``core.route.under_parent``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import xxhash
from multidict import CIMultiDict, CIMultiDictProxy

from kvgate.types import SessionKey, SessionSource

PREFIX_KEY_TAG = "prefix:"
"""Leading tag of the session keys older gateways derived from prompt text.

No key is derived any more (they bound strangers sharing an opening together),
but a shared store may still hold such keys until their TTL runs out, and they
are unknown to workers, so whoever sends keys to a worker skips them.
"""


_CASE_INSENSITIVE = (CIMultiDictProxy, CIMultiDict)
"""Mappings whose ``get`` already ignores case (aiohttp's request headers)."""


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header ``name``, matched case-insensitively; ``None`` if absent.

    Works with case-insensitive multidicts (aiohttp) and plain dicts alike. In a
    multidict an absent name costs one lookup; only a plain mapping is searched
    name by name for ``name`` in another case.
    """
    value = headers.get(name)
    if value is not None or isinstance(headers, _CASE_INSENSITIVE):
        return value
    wanted = name.lower()
    for key, candidate in headers.items():
        if key.lower() == wanted:
            return candidate
    return None


def normalize_key(raw: str, max_chars: int) -> SessionKey | None:
    """``raw`` stripped; hashed to a fixed size when longer than ``max_chars``."""
    key = raw.strip()
    if not key:
        return None
    if len(key) > max_chars:
        return "sha:" + xxhash.xxh3_128_hexdigest(key.encode())
    return key


AGENT_SESSION_HEADERS: tuple[str, ...] = (
    "x-claude-code-session-id",
    "session_id",
    "session-id",
    "x-session-affinity",
)
"""Session headers agent CLIs send without being asked (Claude Code; Codex; pi and others,
as llm-d's agent-identity plugin reads them). Names are matched case-insensitively."""

PARENT_SESSION_HEADERS: tuple[str, ...] = (
    "x-dynamo-parent-session-id",
    "x-parent-session-id",
    "x-claude-code-parent-agent-id",
    "x-codex-parent-thread-id",
)
"""Headers that name a subagent's parent session (NVIDIA Dynamo, opencode, Claude Code,
Codex)."""

_NONE = SessionSource.NONE
"""A module constant: on 3.11 ``Enum.MEMBER`` costs a slow ``EnumType`` lookup a request."""


def session_key_from(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    *,
    header: str,
    use_user_field: bool,
    max_chars: int,
    agent_headers: tuple[str, ...] = (),
) -> tuple[SessionKey | None, SessionSource]:
    """The request's session key and where it came from (header > an agent's identity
    header > ``user`` > none)."""
    raw = header_value(headers, header) if header else None
    if raw is not None:
        key = normalize_key(raw, max_chars)
        if key is not None:
            return key, SessionSource.HEADER
    if agent_headers and headers:
        key = first_header_key(headers, agent_headers, max_chars)
        if key is not None:
            return key, SessionSource.AGENT
    if use_user_field:
        user = body.get("user")
        if isinstance(user, str):
            key = normalize_key(user, max_chars)
            if key is not None:
                return key, SessionSource.USER
    return None, _NONE


def first_header_key(
    headers: Mapping[str, str], names: tuple[str, ...], max_chars: int
) -> SessionKey | None:
    """The key in the first of ``names`` present (case-insensitively) with a non-blank value."""
    for name in names:
        raw = header_value(headers, name)
        if raw is not None:
            key = normalize_key(raw, max_chars)
            if key is not None:
                return key
    return None


def parent_key_from(
    headers: Mapping[str, str], names: tuple[str, ...], max_chars: int
) -> SessionKey | None:
    """The parent session a subagent's request names (``None``: not a subagent's)."""
    return first_header_key(headers, names, max_chars) if names and headers else None
