"""``X-Priority`` and ``X-Model-Version`` are believed only where the operator says."""

from __future__ import annotations

from multidict import CIMultiDict

from kvgate.core.hints import resolved
from kvgate.core.prefix import FeatureConfig, build_features
from kvgate.core.session import TrustedPeers
from kvgate.types import Priority

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ASKED = [("x-priority", "critical"), ("X-MODEL-VERSION", "canary")]


def hints(
    cfg: FeatureConfig, pairs: list[tuple[str, str]], peer: str | None = "10.0.0.7"
) -> tuple[Priority, str | None]:
    f = build_features(BODY, CIMultiDict(pairs), cfg, request_id="r", peer=peer)
    return f.priority, f.pinned_version


def test_whose_priority_and_pin_are_believed() -> None:
    hop = TrustedPeers(trusted_peers=("10.0.0.0/8",))
    # One tenant (the library's default, a gateway without keys): the client's.
    assert hints(FeatureConfig(), ASKED) == (Priority.CRITICAL, "canary")
    assert hints(FeatureConfig(client_hints="all"), ASKED) == (Priority.CRITICAL, "canary")
    # Not believed: the operator's default priority, versions by weight.
    never = FeatureConfig(client_hints="none", default_priority="sheddable")
    assert hints(never, ASKED) == (Priority.SHEDDABLE, None)
    assert hints(FeatureConfig(client_hints="none"), ASKED) == (Priority.STANDARD, None)
    # A trusted hop's, sent once, in any case; anyone else's or a repeated one: ignored.
    trusted = FeatureConfig(client_hints=hop, default_priority="sheddable")
    assert hints(trusted, ASKED) == (Priority.CRITICAL, "canary")
    assert hints(trusted, ASKED, peer="192.168.1.5") == (Priority.SHEDDABLE, None)
    assert hints(trusted, ASKED, peer=None) == (Priority.SHEDDABLE, None)
    twice = [*ASKED, ("X-Priority", "critical")]
    assert hints(trusted, twice)[0] is Priority.SHEDDABLE
    # An unknown priority is the default, not STANDARD.
    assert hints(trusted, [("X-Priority", "urgent!")])[0] is Priority.SHEDDABLE
    # ``auto``: the gateway's one tenant believes them, several tenants do not.
    assert resolved("auto", tenants=False) == "all"
    assert resolved("auto", tenants=True) == "none"
    assert resolved(hop, tenants=True) is hop


def test_the_gateway_resolves_auto_from_its_tenants() -> None:
    from kvgate.gateway.config import parse_config

    assert parse_config({}).features_in_force().client_hints == "all"
    assert parse_config({"api_keys": ["sk-x"]}).features_in_force().client_hints == "none"
    scope = {"session_scope": {"header": "x-user-id", "trusted_peers": ["10.0.0.0/8"]}}
    assert parse_config({"features": scope}).features_in_force().client_hints == "none"
    kept = parse_config({"api_keys": ["sk-x"], "features": {"client_hints": "all"}})
    assert kept.features_in_force().client_hints == "all"
