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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from kvgate.core.session import TrustedPeers, header_value

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
