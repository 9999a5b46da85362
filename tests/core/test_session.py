"""Header lookups for session keys: any case, any mapping."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

from kvgate.core.session import header_value


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
