"""Client API keys (``api_keys``): a plain key, or a key with settings of its own.

::

    api_keys:
      - "${TEAM_A_KEY}"                  # a plain key: the gateway's settings
      - key: "${BATCH_KEY}"
        name: nightly-batch              # for people; never the key itself
        priority: sheddable              # its requests' default priority
      - key_file: /run/secrets/router    # the key read from a file
        name: router
        client_hints: true               # its X-Priority / X-Model-Version believed

A key's ``priority`` replaces ``features.default_priority`` for its requests;
``client_hints: true`` lets its requests set ``X-Priority`` and ``X-Model-Version`` where
``features.client_hints`` is ``auto`` (an explicit ``all``, ``none`` or
``{trusted_peers}`` is the operator's word for every key). The authentication compares
keys in constant time (``dataplane.middleware.key_presented``); the settings are then
found by the presented key's digest (``core.hints.KeyedHints``). No key is ever
rendered: the list is left out of the config's ``repr`` and so is each key.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvgate.core.hints import HintTrust, KeyedHints, key_digest
from kvgate.core.session import SessionScope, credential_of


class ApiKey(BaseModel):
    """One client API key with its own settings (an ``api_keys`` entry may also be the
    key alone: then the gateway's ``features.default_priority`` and ``client_hints``).

    Example::

        api_keys:
          - "${TEAM_A_KEY}"
          - key: "${BATCH_KEY}"
            name: nightly-batch
            priority: sheddable
          - key_file: /run/secrets/router
            name: router
            client_hints: true
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=1, repr=False)
    """The secret (``${ENV}`` or ``key_file`` as any secret of the config)."""
    name: str | None = Field(default=None, pattern=r"^[^\x00-\x1f\x7f]{1,64}$")
    """A name for people (the access log's ``key``, dashboards); not a secret, never the
    key. At most 64 characters, no control characters."""
    priority: Literal["sheddable", "standard", "critical"] | None = None
    """Its requests' default priority (unset: ``features.default_priority``)."""
    client_hints: bool = False
    """Under ``features.client_hints: auto``, believe its requests' ``X-Priority`` and
    ``X-Model-Version`` (else, with client keys, nobody's are)."""


def secrets_of(keys: Sequence[str | ApiKey]) -> list[str]:
    """The keys themselves, as the authentication checks them."""
    return [k if isinstance(k, str) else k.key for k in keys]


def keyed_hints(
    keys: Sequence[str | ApiKey], setting: HintTrust, trust: HintTrust, priority: str
) -> KeyedHints | None:
    """``client_hints`` as the gateway runs it with keys of their own settings (``None``:
    no key has any). ``setting``: the configured one; ``trust``: as resolved."""
    own: dict[bytes, tuple[HintTrust, str]] = {}
    for entry in keys:
        if isinstance(entry, str) or (entry.priority is None and not entry.client_hints):
            continue
        believed: HintTrust = "all" if setting == "auto" and entry.client_hints else trust
        own[key_digest(entry.key)] = (believed, entry.priority or priority)
    return KeyedHints(trust, priority, own) if own else None


@dataclass(frozen=True, slots=True)
class KeyNames:
    """The names of the named client keys, found by the presented key's digest (as
    ``KeyedHints`` finds settings): what the access log says of a request's tenant.

    The log never holds the key, nor a digest of it: an unkeyed digest of a secret is
    the same in every deployment and log that sees it (it correlates a tenant across
    them) and a weak key could be guessed back from it offline. A name is the
    operator's own word for the key, nothing more.
    """

    names: Mapping[bytes, str]

    def of(self, headers: Mapping[str, str]) -> str | None:
        """The name of the key ``headers`` present (``credential_of``); ``None``: none,
        unnamed, or not a client key."""
        credential = credential_of(headers)
        return None if credential is None else self.names.get(key_digest(credential))


def key_names(keys: Sequence[str | ApiKey]) -> KeyNames | None:
    """The named keys' names (``None``: no key is named, nothing to look up per request)."""
    names = {
        key_digest(entry.key): entry.name
        for entry in keys
        if not isinstance(entry, str) and entry.name is not None
    }
    return KeyNames(names) if names else None


def unchecked_tenants(keys: Sequence[str | ApiKey], scope: SessionScope, host: str) -> str | None:
    """What to warn of at start when a gateway others can reach takes each bearer token as a
    tenant without checking it (``session_scope: credential``, no ``api_keys``); else ``None``.

    Every per-tenant bound (``store.max_sessions_per_scope``, ``max_holders_per_scope``, a
    full memory store's even share) holds per tenant: where anyone may present a new token,
    a client making up one a request is as many tenants, and squeezes every other tenant's
    share of a full store. Scopes still keep clients apart (nobody takes another's session
    without its token), so this is no refusal: one tenant behind an auth proxy that checks
    tokens is served as before. Loopback-only gateways say nothing (nobody else can reach
    them).
    """
    if keys or scope != "credential" or _loopback(host):
        return None
    return (
        "session_scope is 'credential' and no api_keys are set: bearer tokens are not checked "
        f"here, and on {host} anyone may present new ones, each a tenant of its own, so the "
        "store's per-tenant bounds do not keep one client from crowding out the others; set "
        "api_keys, or session_scope {header, trusted_peers} behind an auth proxy"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any address
