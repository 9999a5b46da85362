"""Session keys: which earlier requests a request belongs with.

First found wins: a configured header (default ``X-Session-ID``), then the
OpenAI ``user`` field (can be turned off), then none. Over-long keys are hashed
so a client cannot make the affinity store hold arbitrarily large keys.
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


_NONE = SessionSource.NONE
"""A module constant: on 3.11 ``Enum.MEMBER`` costs a slow ``EnumType`` lookup a request."""


def session_key_from(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    *,
    header: str,
    use_user_field: bool,
    max_chars: int,
) -> tuple[SessionKey | None, SessionSource]:
    """The request's session key and where it came from (header > ``user`` > none)."""
    raw = header_value(headers, header) if header else None
    if raw is not None:
        key = normalize_key(raw, max_chars)
        if key is not None:
            return key, SessionSource.HEADER
    if use_user_field:
        user = body.get("user")
        if isinstance(user, str):
            key = normalize_key(user, max_chars)
            if key is not None:
                return key, SessionSource.USER
    return None, _NONE
