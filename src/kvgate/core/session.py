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

A session id is the client's to choose, so it is scoped by the client's credential:
when a request carries one (``Authorization: Bearer <key>``, else ``x-api-key``), its
session key (and its parent's) is a digest of (the credential, the id) (``scoped``), so
two clients that send the same id never share an affinity, a saved slot or a store
entry. The digest is unkeyed (every replica and the endpoint picker derive the same key
for the shared store) and one-way (BLAKE2b): the credential itself is never a key.
A request without a credential keeps its id as it is (the simulator's placements).

What scopes them is ``features.session_scope`` (``scope_of``): ``credential`` (the
default, above); ``{header: <name>, trusted_peers: [...]}``, the identity a trusted hop
sets (an auth proxy's ``x-user-id``, Envoy ext_authz's header), read only from a peer in
``trusted_peers`` and present exactly once, else the request's session ids are ignored
(``REFUSED``: it is routed by its prompt alone); or ``none`` (ids shared by whoever
sends them: one tenant only). The identity is digested as a credential is, under a tag
no credential can start with, and is never a key, a log line nor a label.

Every scoped or owned key names its scope's tenant (``tenant_tag``, a digest of the scope
alone) before its own digest, ``cred:<tenant>.<digest>``: the store bounds each tenant's
entries by it (``tenant_of``, ``store.max_sessions_per_scope``), so a client flooding the
store with ids evicts only its own oldest, never another tenant's bindings.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from functools import cached_property
from hashlib import blake2b
from typing import Any, Literal

import xxhash
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import BaseModel, ConfigDict, Field, field_validator

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


SCOPED_TAG = "cred:"
"""Leading tag of a session key scoped by a client's credential (``scoped``). An id a
client sends that already starts with it (with no credential to scope it) is hashed, so
no one can name a scoped key without holding its credential."""


_POSING = (SCOPED_TAG, "owned:")
"""Tags of keys no client names: an unscoped id starting with one is hashed (``scoped``;
``owned:`` is ``OWNED_TAG``)."""


def credential_of(headers: Mapping[str, str]) -> bytes | None:
    """The client's credential: the token of ``Authorization: Bearer``, else ``x-api-key``
    (what ``dataplane.middleware.key_presented`` checks); ``None`` without one."""
    if not headers:
        return None
    auth = header_value(headers, "authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            return token.encode("utf-8", "surrogatepass")
    given = header_value(headers, "x-api-key")
    if given is not None and given.strip():
        return given.strip().encode("utf-8", "surrogatepass")
    return None


IDENTITY_TAG = b"\0identity\0"
"""Leading bytes of a trusted hop's identity as a scope: no credential starts with a NUL
(no header value holds one), so an identity never shares a space with a bearer token."""

REFUSED = b""
"""The scope of a request whose identity is required and missing (or not trusted): its
session ids are ignored (``scoped`` gives ``None``)."""

_MAX_PEERS = 1024
"""Peer addresses whose trust is remembered (``HeaderScope.trusts``); then started over."""


class TrustedPeers(BaseModel):
    """The socket peers (an auth proxy, Envoy) whose headers are believed.

    Example (``X-Priority`` and ``X-Model-Version`` as the auth proxy sets them per user)::

        features:
          client_hints:
            trusted_peers: [10.0.0.0/8, "::1"]
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    trusted_peers: tuple[str, ...] = Field(min_length=1)
    """Addresses or networks (``10.0.0.0/8``, ``::1``) the header is read from; a request
    from any other peer has it ignored. ``0.0.0.0/0`` and ``::/0`` trust every peer: only
    when nothing else can reach the gateway."""

    @field_validator("trusted_peers")
    @classmethod
    def _networks_parse(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            try:
                ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ValueError(f"not an address or network: {text!r}") from None
        return value

    @cached_property
    def _networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(text, strict=False) for text in self.trusted_peers)

    @cached_property
    def _trust(self) -> dict[str, bool]:
        return {}

    def trusts(self, peer: str | None) -> bool:
        """True when ``peer`` (an IP address as text; ``None``: not known) is trusted."""
        if not peer:
            return False
        memo = self._trust
        known = memo.get(peer)
        if known is not None:
            return known
        try:
            address = ipaddress.ip_address(peer.partition("%")[0])
        except ValueError:
            trusted = False
        else:
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                address = address.ipv4_mapped
            trusted = any(address in network for network in self._networks)
        if len(memo) >= _MAX_PEERS:
            memo.clear()
        memo[peer] = trusted
        return trusted

    def once(self, headers: Mapping[str, str], name: str, peer: str | None) -> str | None:
        """Header ``name`` (any case) from a trusted ``peer``, sent exactly once (the hop
        sets it, replacing any the client sent: one beside a client's is no value)."""
        if not headers or not self.trusts(peer):
            return None
        if isinstance(headers, _CASE_INSENSITIVE):
            values = headers.getall(name, ())
            return values[0] if len(values) == 1 else None
        return header_value(headers, name)


class HeaderScope(TrustedPeers):
    """``features.session_scope`` as a trusted hop's identity header.

    Example::

        features:
          session_scope:
            header: x-user-id               # set by the auth proxy / Envoy ext_authz
            trusted_peers: [10.0.0.0/8]     # the addresses that hop connects from
    """

    header: str = Field(pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
    """The identity header (case-insensitive). The hop must set it on every request,
    replacing any the client sent: one sent twice is no identity. For the endpoint
    picker, Envoy's ext_authz filter must come before ext_proc in its filter chain."""

    def identity(self, headers: Mapping[str, str], peer: str | None) -> bytes:
        """The scope of a request from ``peer``: its identity, or ``REFUSED``."""
        value = self.once(headers, self.header, peer)  # none, or a client's beside the hop's
        if value is None or not value.strip():
            return REFUSED
        return IDENTITY_TAG + value.strip().encode("utf-8", "surrogatepass")


SessionScope = Literal["credential", "none"] | HeaderScope
"""What a session id is scoped by (``features.session_scope``)."""


def scope_of(setting: SessionScope, headers: Mapping[str, str], peer: str | None) -> bytes | None:
    """The scope of a request's session ids: the client's credential, a trusted hop's
    identity (``REFUSED`` without one) or ``None`` (ids as sent)."""
    if setting == "credential":
        return credential_of(headers)
    if setting == "none":
        return None
    assert isinstance(setting, HeaderScope)
    return setting.identity(headers, peer)


def scoped(key: SessionKey | None, credential: bytes | None) -> SessionKey | None:
    """``key`` in the credential's own space: a digest of both when there is a
    credential (or identity, ``scope_of``); ``None`` when it is ``REFUSED``; otherwise
    ``key`` itself (hashed if it poses as a scoped or owned one)."""
    if key is None or credential == REFUSED:
        return None
    if credential is None:
        if key.startswith(_POSING):
            return "sha:" + xxhash.xxh3_128_hexdigest(key.encode("utf-8", "surrogatepass"))
        return key
    digest = blake2b(credential, digest_size=16)
    digest.update(b"\0")
    digest.update(key.encode("utf-8", "surrogatepass"))
    return f"{SCOPED_TAG}{tenant_tag(credential)}.{digest.hexdigest()}"


def tenant_tag(scope: bytes | None) -> str:
    """The tenant a scope's keys are counted under in the store (16 hex digits, one-way,
    a domain of its own); ``""`` for no scope: the unscoped ids and the credential-less."""
    if not scope:
        return ""
    return blake2b(scope, digest_size=8, person=b"kvgate.tenant").hexdigest()


def tenant_of(key: SessionKey) -> str:
    """The tenant a store key is counted under (``tenant_tag``): named by a scoped or owned
    key, ``""`` for any other (an unscoped id: no client can pose as a scoped key)."""
    if key.startswith(SCOPED_TAG):
        rest = key[len(SCOPED_TAG) :]
    elif key.startswith(OWNED_TAG):
        rest = key[len(OWNED_TAG) :]
    else:
        return ""
    tag, dot, _ = rest.partition(".")
    return tag if dot else ""


OWNED_TAG = "owned:"
"""Leading tag of a stored response's key under a session scope (``owned``)."""


def owned(key: SessionKey, scope: bytes | None) -> SessionKey | None:
    """A stored response's continuation key (``response:<id>``) in the space of the scope
    whose request the response answered, as it is recorded and as a continuation looks it
    up: a continuation from another scope finds nothing (the response is not theirs).

    Unlike ``scoped``, a request without a credential (``None``) is a scope of its own,
    not the unscoped space: unscoped keys (``session_scope: none``, and what gateways
    before this wrote) are never read through it. ``None`` when ``REFUSED``: such a
    request can neither own nor continue a response. A domain of its own (BLAKE2b
    personalisation): no session key is ever equal to one."""
    if scope == REFUSED:
        return None
    owner = scope or b""
    digest = blake2b(len(owner).to_bytes(4, "big"), digest_size=16, person=b"kvgate.owned")
    digest.update(owner)
    digest.update(key.encode("utf-8", "surrogatepass"))
    return f"{OWNED_TAG}{tenant_tag(owner)}.{digest.hexdigest()}"


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
    scope: SessionScope = "credential",
    peer: str | None = None,
) -> tuple[SessionKey | None, SessionSource]:
    """The request's session key and where it came from (header > an agent's identity
    header > ``user`` > none), scoped as ``scope`` says (``scope_of``; ``peer``: the
    address the request came from)."""
    key: SessionKey | None = None
    source = _NONE
    raw = header_value(headers, header) if header else None
    if raw is not None:
        key = normalize_key(raw, max_chars)
        source = SessionSource.HEADER
    if key is None and agent_headers and headers:
        key = first_header_key(headers, agent_headers, max_chars)
        source = SessionSource.AGENT
    if key is None and use_user_field:
        user = body.get("user")
        if isinstance(user, str):
            key = normalize_key(user, max_chars)
            source = SessionSource.USER
    if key is None:
        return None, _NONE
    key = scoped(key, scope_of(scope, headers, peer))
    return (key, source) if key is not None else (None, _NONE)


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
    headers: Mapping[str, str],
    names: tuple[str, ...],
    max_chars: int,
    scope: SessionScope = "credential",
    peer: str | None = None,
) -> SessionKey | None:
    """The parent session a subagent's request names (``None``: not a subagent's), scoped
    as its session key is."""
    if not names or not headers:
        return None
    key = first_header_key(headers, names, max_chars)
    return scoped(key, scope_of(scope, headers, peer)) if key is not None else None
