"""What a client may say about its own request: its priority and a model version pin.

``X-Priority`` orders shedding (the lowest priority is refused first) and
``X-Model-Version`` pins a version (a canary, the stable one). Both are any client's to
send, so believed only where the operator says (``features.client_hints``):

- ``all``: from every client (one tenant; a gateway with no ``api_keys``);
- ``none``: never: every request is ``default_priority``, and versions go by weight;
- ``{trusted_peers: [...]}``: only as a trusted hop (an auth proxy, Envoy ext_authz) sets
  them, from those peers and sent once (it replaces the client's), as ``session_scope``'s
  identity header is read;
- ``auto`` (the default): ``all`` for one tenant (no ``api_keys``, ``session_scope`` not
  an identity header), else ``none`` (``resolved``).

Ignored headers are not errors: the request is served, at ``default_priority``.

A client API key may carry its own settings (``api_keys`` entries as mappings): its
default priority, and under ``auto`` whether its requests' hints are believed. The
gateway then runs ``KeyedHints`` in ``client_hints``'s place (``GatewayConfig
.features_in_force``): the key a request presented (already checked in constant time by
the authentication) picks its settings by its digest, never by comparing secrets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from kvgate.core.session import TrustedPeers, credential_of, header_value

HintTrust = Literal["auto", "all", "none"] | TrustedPeers
"""Whose ``X-Priority`` and ``X-Model-Version`` are believed (``features.client_hints``)."""


def resolved(setting: HintTrust, *, tenants: bool) -> HintTrust:
    """``auto`` as the gateway runs it: ``none`` when it serves several ``tenants`` (client
    API keys, or an identity header scope), else ``all``; any other setting as it is."""
    if setting != "auto":
        return setting
    return "none" if tenants else "all"


def hint(setting: HintTrust, headers: Mapping[str, str], name: str, peer: str | None) -> str | None:
    """Header ``name`` (any case) if ``setting`` lets the request from ``peer`` set it."""
    if setting == "none":
        return None
    if isinstance(setting, TrustedPeers):
        return setting.once(headers, name, peer)
    return header_value(headers, name)  # all, or auto outside a gateway (one tenant)


def key_digest(key: str | bytes) -> bytes:
    """The digest a client API key's settings are found by (one-way: no secret is kept)."""
    raw = key.strip() if isinstance(key, bytes) else key.strip().encode("utf-8", "surrogatepass")
    return hashlib.blake2b(raw, digest_size=16, person=b"kvgate.apikey").digest()


@dataclass(frozen=True, slots=True)
class KeyedHints:
    """``client_hints`` with per-key settings: ``keys`` maps a key's digest to the trust
    and default priority its requests get; a request with any other key (or none) gets
    ``trust`` and ``priority``, the gateway's own."""

    trust: HintTrust
    priority: str
    keys: Mapping[bytes, tuple[HintTrust, str]]

    def of(self, headers: Mapping[str, str]) -> tuple[HintTrust, str]:
        """The trust and default priority of the key ``headers`` present, as the
        authentication reads it (``core.session.credential_of``: ``Authorization: Bearer``,
        else ``x-api-key``; one credential a request, never a second one's settings)."""
        credential = credential_of(headers)
        if credential is not None:
            own = self.keys.get(key_digest(credential))
            if own is not None:
                return own
        return self.trust, self.priority


def in_force(
    trust: HintTrust | KeyedHints, headers: Mapping[str, str], default: str
) -> tuple[HintTrust, str]:
    """The trust and default priority for a request with ``headers``."""
    if isinstance(trust, KeyedHints):
        return trust.of(headers)
    return trust, default
