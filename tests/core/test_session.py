"""Header lookups for session keys: any case, any mapping."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

from kvgate.core.session import IDENTITY_TAG, REFUSED, header_value, owned, scoped


def test_header_value_ignores_case_in_every_kind_of_mapping() -> None:
    plain = {"x-session-id": "a", "Content-Type": "application/json"}
    for headers in (plain, CIMultiDict(plain), CIMultiDictProxy(CIMultiDict(plain))):
        assert header_value(headers, "X-Session-ID") == "a"
        assert header_value(headers, "content-type") == "application/json"
        assert header_value(headers, "X-Priority") is None


def test_a_session_id_is_scoped_by_the_clients_credential() -> None:
    from kvgate.core.prefix import build_features
    from kvgate.core.session import SCOPED_TAG, scoped, session_key_from

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    def key(headers: dict[str, str], payload: dict[str, object] = body) -> str | None:
        return build_features(payload, headers, request_id="r").session_key

    alice = key({"X-Session-ID": "shared", "Authorization": "Bearer sk-alice"})
    bob = key({"x-session-id": "shared", "AUTHORIZATION": "bearer sk-bob"})
    assert alice is not None and bob is not None and alice != bob
    assert alice.startswith(SCOPED_TAG) and "sk-alice" not in alice
    # The same credential in any case of header, or as x-api-key, is the same client.
    assert key({"x-session-id": "shared", "authorization": "Bearer  sk-alice "}) == alice
    assert key({"X-Session-ID": "shared", "X-Api-Key": "sk-alice"}) == alice
    # The user field and an agent's header are scoped too; so is a subagent's parent.
    user = {**body, "user": "shared"}
    assert key({"Authorization": "Bearer sk-alice"}, user) == alice
    parent = build_features(
        body,
        {"x-claude-code-parent-agent-id": "shared", "Authorization": "Bearer sk-bob"},
        request_id="r",
    ).parent_key
    assert parent == bob
    # Every caller of session_key_from (the proxy, the passthrough, the picker) agrees.
    plain, _ = session_key_from(
        CIMultiDict({"X-Session-ID": "shared", "Authorization": "Bearer sk-alice"}),
        {},
        header="X-Session-ID",
        use_user_field=True,
        max_chars=256,
    )
    assert plain == alice
    # Without a credential an id stays as it is (the simulator's keys); one posing as a
    # scoped key is hashed out of that space.
    assert key({"X-Session-ID": "shared"}) == "shared"
    assert key({"X-Session-ID": "shared", "Authorization": "Basic eDp5"}) == "shared"
    posing = key({"X-Session-ID": alice})
    assert posing is not None and posing != alice and posing.startswith("sha:")
    assert scoped(None, b"sk") is None


def test_a_trusted_hops_identity_header_scopes_session_ids() -> None:
    """``session_scope: {header, trusted_peers}``: behind an auth proxy that replaces the
    client's credential with its own, the identity it sets is the scope; read only from a
    trusted peer and only once, else the session ids are ignored (never shared)."""
    from kvgate.core.prefix import FeatureConfig, build_features
    from kvgate.core.session import HeaderScope

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "u"}
    scope = HeaderScope(header="X-User-Id", trusted_peers=("10.0.0.0/8", "::1"))
    cfg = FeatureConfig(session_scope=scope)

    def keys(pairs: list[tuple[str, str]], peer: str | None = "10.1.2.3") -> tuple[object, ...]:
        f = build_features(body, CIMultiDict(pairs), cfg, request_id="r", peer=peer)
        return f.session_key, f.parent_key, f.session_source.value

    proxy = ("Authorization", "Bearer the-proxys-own-token")
    sid, parent = ("X-Session-ID", "shared"), ("x-parent-session-id", "p")
    alice = keys([proxy, sid, parent, ("x-user-id", "alice")])
    bob = keys([proxy, sid, parent, ("X-USER-ID", "bob")])
    assert alice[0] != bob[0] and alice[1] != bob[1] and alice[2] == "header"
    assert all("alice" not in str(k) for k in alice)
    # A rotated token is the same session: only the identity counts.
    rotated = keys([("Authorization", "Bearer jwt-2"), sid, parent, ("x-user-id", "alice")])
    assert rotated == alice
    assert keys([sid, parent, ("x-user-id", "alice")], peer="::ffff:10.9.9.9") == alice
    # No identity, an untrusted peer, an unknown one, a second header: no session at all
    # (the user field, the agent headers and the parent alike).
    refused = (None, None, "none")
    assert keys([proxy, sid, parent]) == refused
    assert keys([proxy, parent, ("x-user-id", " ")]) == refused
    assert keys([proxy, sid, parent, ("x-user-id", "alice")], peer="192.168.1.1") == refused
    assert keys([proxy, sid, parent, ("x-user-id", "alice")], peer=None) == refused
    two = [sid, ("x-user-id", "mallory"), ("X-User-Id", "alice")]
    assert keys(two) == refused
    # An identity never shares a space with a credential of the same bytes.
    credential = build_features(
        body, {"X-Session-ID": "shared", "Authorization": "Bearer alice"}, request_id="r"
    ).session_key
    assert credential is not None and credential != alice[0]


def test_session_scope_none_shares_ids_and_bad_peers_are_refused_at_load() -> None:
    import pytest
    from pydantic import ValidationError

    from kvgate.core.prefix import FeatureConfig, build_features
    from kvgate.core.session import HeaderScope

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    cfg = FeatureConfig(session_scope="none")
    for token in ("sk-a", "sk-b"):
        headers = {"X-Session-ID": "shared", "Authorization": f"Bearer {token}"}
        assert build_features(body, headers, cfg, request_id="r").session_key == "shared"
    for peers in ((), ("10.0.0.0/33",), ("proxy.local",)):
        with pytest.raises(ValidationError):
            HeaderScope(header="x-user-id", trusted_peers=peers)
    with pytest.raises(ValidationError):
        HeaderScope(header="x-user-id\r\nx-evil", trusted_peers=("::1",))
    config = FeatureConfig.model_validate(
        {"session_scope": {"header": "x-user-id", "trusted_peers": ["127.0.0.1"]}}
    )
    assert isinstance(config.session_scope, HeaderScope)


def test_a_stored_responses_key_is_its_creators_own() -> None:
    """``owned``: one key per (scope, response), none shared with another scope, the
    credential-less scope or any session key; a refused scope owns nothing."""
    key = "response:resp_0123"
    scopes = [None, b"sk-alice", b"sk-bob", IDENTITY_TAG + b"alice"]
    keys = [owned(key, scope) for scope in scopes]
    assert len(set(keys)) == len(scopes)
    assert all(k is not None and k.startswith("owned:") and "alice" not in k for k in keys)
    assert owned(key, b"sk-alice") == keys[1]  # every replica and the picker agree
    assert owned("response:resp_0124", b"sk-alice") != keys[1]
    assert owned(key, REFUSED) is None
    assert scoped(key, b"sk-alice") not in keys  # a session id equal to it stays apart
    # An unscoped id posing as an owned key is hashed, as one posing as a scoped one.
    posing = keys[0]
    assert posing is not None and scoped(posing, None) != posing
