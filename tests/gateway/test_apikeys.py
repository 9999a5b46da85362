"""Client API keys with settings of their own: a key's default priority, and whether its
``X-Priority`` / ``X-Model-Version`` are believed (``gateway.apikeys``)."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict

from kvgate.core.prefix import build_features, request_priority
from kvgate.core.session import HeaderScope
from kvgate.gateway.apikeys import unchecked_tenants
from kvgate.gateway.app import Gateway
from kvgate.gateway.config import ConfigError, parse_config
from kvgate.gateway.testing import running_gateway
from kvgate.types import Priority

from .conftest import every_worker_up
from .rollout_fleet import versioned_fleet

PLAIN = "sk-plain-0123456789"
BATCH = "sk-batch-0123456789"
ROUTER = "sk-router-0123456789"
KEYS = [
    PLAIN,
    {"key": BATCH, "name": "nightly", "priority": "sheddable"},
    {"key": ROUTER, "name": "router", "client_hints": True, "priority": "critical"},
]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ASKED = [("X-Priority", "critical"), ("X-Model-Version", "canary")]


def _hints(config: dict, pairs: list[tuple[str, str]]) -> tuple[Priority, str | None]:
    cfg = parse_config(config).features_in_force()
    headers = CIMultiDict(pairs)
    f = build_features(BODY, headers, cfg, request_id="r", peer="10.0.0.7")
    assert request_priority(headers, cfg, "10.0.0.7") is f.priority  # every endpoint alike
    return f.priority, f.pinned_version


def test_each_key_has_its_own_priority_and_hints() -> None:
    config = {"api_keys": KEYS, "features": {"default_priority": "standard"}}
    bearer = lambda key: [("Authorization", f"Bearer {key}")]  # noqa: E731
    # A plain key: the gateway's settings (auto with keys: nobody's hints).
    assert _hints(config, bearer(PLAIN) + ASKED) == (Priority.STANDARD, None)
    # The batch key: its own default priority, its hints not believed.
    assert _hints(config, bearer(BATCH) + ASKED) == (Priority.SHEDDABLE, None)
    assert _hints(config, [("x-api-key", BATCH), *ASKED]) == (Priority.SHEDDABLE, None)
    # The router key: its hints believed (under auto), else its own default.
    assert _hints(config, bearer(ROUTER) + ASKED) == (Priority.CRITICAL, "canary")
    assert _hints(config, [*bearer(ROUTER), ("X-Priority", "sheddable")])[0] is (Priority.SHEDDABLE)
    assert _hints(config, bearer(ROUTER)) == (Priority.CRITICAL, None)
    # No key, or one it does not know (the authentication refuses those anyway).
    assert _hints(config, ASKED) == (Priority.STANDARD, None)
    assert _hints(config, bearer("sk-other") + ASKED) == (Priority.STANDARD, None)
    # An explicit client_hints is the operator's word for every key.
    never = {**config, "features": {"client_hints": "none"}}
    assert _hints(never, bearer(ROUTER) + ASKED) == (Priority.CRITICAL, None)
    assert _hints(never, bearer(BATCH) + ASKED) == (Priority.SHEDDABLE, None)
    everyone = {**config, "features": {"client_hints": "all"}}
    assert _hints(everyone, bearer(BATCH) + ASKED) == (Priority.CRITICAL, "canary")
    # Plain keys only: as before (no per-key lookup at all).
    assert parse_config({"api_keys": [PLAIN]}).features_in_force().client_hints == "none"


def test_keys_come_from_the_environment_or_files_and_are_never_rendered(tmp_path: Path) -> None:
    secret = tmp_path / "router"
    secret.write_text(ROUTER + "\n")
    config = parse_config(
        {
            "api_keys": [
                "${PLAIN_KEY}",
                {"key": "${BATCH_KEY}", "priority": "sheddable"},
                {"key_file": str(secret), "name": "router", "client_hints": True},
            ]
        },
        env={"PLAIN_KEY": PLAIN, "BATCH_KEY": BATCH},
    )
    assert config.client_keys == [PLAIN, BATCH, ROUTER]
    assert config.metrics_keys == [PLAIN, BATCH, ROUTER]
    # The config's repr leaves the list out; a keyed entry's repr leaves its key out.
    for text in (repr(config), str(config), repr(config.api_keys[1:])):
        for key in (PLAIN, BATCH, ROUTER):
            assert key not in text
    assert "router" in repr(config.api_keys[2])  # its name is not a secret
    # A bad entry's error names the place, never the key.
    for bad in (
        {"key": BATCH, "priority": "urgent"},
        {"key": BATCH, "client_hints": "maybe"},
        {"key": BATCH, "secret": "x"},
        {"name": BATCH},
    ):
        with pytest.raises(ConfigError) as info:
            parse_config({"api_keys": [PLAIN, bad]})
        assert "api_keys.1" in str(info.value)
        assert BATCH not in str(info.value) and PLAIN not in str(info.value)


async def test_a_keys_settings_hold_on_the_live_gateway() -> None:
    """Only the key with ``client_hints: true`` may pin the canary (weight 0); every key of
    either form is let in, on both servers' paths (chat: llhttp, completions)."""
    async with versioned_fleet() as fleet:
        config = fleet.config(api_keys=KEYS)
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await every_worker_up(gw)
            for key, served in ((PLAIN, "v1"), (BATCH, "v1"), (ROUTER, "v2"), ("nope", None)):
                headers = {"Authorization": f"Bearer {key}", "X-Model-Version": "v2"}
                for path, body in (
                    ("/v1/completions", {"model": "demo", "prompt": "hi", "max_tokens": 2}),
                    (
                        "/v1/chat/completions",
                        {"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
                    ),
                ):
                    async with session.post(gw.url + path, json=body, headers=headers) as resp:
                        text = await resp.text()
                        if served is None:
                            assert resp.status == 401
                            assert all(k not in text for k in (PLAIN, BATCH, ROUTER))
                            continue
                        assert resp.status == 200, text
                        assert resp.headers["X-Kvgate-Model-Version"] == served, (key, path)


async def test_one_credential_a_request_a_valid_x_api_key_beside_another_bearer_is_refused() -> (
    None
):
    """The bearer token, when there is one, is the request's credential: it scopes the
    sessions and picks the key's settings, so it is what must be a key. A valid
    ``x-api-key`` beside a made-up bearer token let a client name any scope it liked (a new
    tenant a request: past ``store.max_sessions_per_scope``). Both servers' paths."""
    # The settings are the bearer key's too, never those of a second key beside it.
    bearer_plain = [("Authorization", f"Bearer {PLAIN}"), ("x-api-key", ROUTER)]
    assert _hints({"api_keys": KEYS}, bearer_plain + ASKED) == (Priority.STANDARD, None)
    async with versioned_fleet() as fleet:
        config = fleet.config(api_keys=KEYS)
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await every_worker_up(gw)
            for headers, status in (
                ({"Authorization": "Bearer made-up-1", "x-api-key": PLAIN}, 401),
                ({"Authorization": "Bearer made-up-2", "x-api-key": ROUTER}, 401),
                ({"x-api-key": PLAIN}, 200),
                ({"Authorization": "Basic dXNlcjpwdw==", "x-api-key": PLAIN}, 200),
                ({"Authorization": f"Bearer {PLAIN}", "x-api-key": "anything"}, 200),
            ):
                for path, body in (
                    ("/v1/completions", {"model": "demo", "prompt": "hi", "max_tokens": 2}),
                    (
                        "/v1/chat/completions",
                        {"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
                    ),
                ):
                    async with session.post(gw.url + path, json=body, headers=headers) as resp:
                        assert resp.status == status, (headers, path, await resp.text())


def test_unchecked_tokens_on_a_reachable_gateway_are_warned_of() -> None:
    """``session_scope: credential`` without ``api_keys`` takes each bearer token as a
    tenant unchecked: on an address others reach, anyone making up tokens is as many
    tenants, past every per-tenant bound. Said at start; keys, an identity header, ``none``
    (one tenant by the operator's word) or a loopback-only listener say nothing."""
    scope = HeaderScope(header="x-user-id", trusted_peers=("10.0.0.0/8",))
    warned = unchecked_tenants([], "credential", "0.0.0.0")
    assert warned is not None and "api_keys" in warned and "0.0.0.0" in warned
    assert unchecked_tenants([], "credential", "10.1.2.3") is not None
    assert unchecked_tenants([], "credential", "gateway.internal") is not None
    for quiet in (
        unchecked_tenants([PLAIN], "credential", "0.0.0.0"),
        unchecked_tenants([], scope, "0.0.0.0"),
        unchecked_tenants([], "none", "0.0.0.0"),
        unchecked_tenants([], "credential", "127.0.0.1"),
        unchecked_tenants([], "credential", "::1"),
        unchecked_tenants([], "credential", "localhost"),
    ):
        assert quiet is None


async def test_the_gateway_warns_of_unchecked_tokens_when_it_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for listen, keys, warned in (("0.0.0.0", [], True), ("0.0.0.0", [PLAIN], False),
                                 ("127.0.0.1", [], False)):  # fmt: skip
        caplog.clear()
        settings = {"listen": {"host": listen}, "api_keys": keys, "admin": {"enabled": False}}
        gateway = Gateway(parse_config(settings))
        with caplog.at_level(logging.WARNING, logger="kvgate"):
            await gateway.start()
            await gateway.stop()
        said = [
            r.getMessage()
            for r in caplog.records
            if "bearer tokens are not checked" in r.getMessage()
        ]
        assert len(said) == warned, (listen, keys, said)
        assert all(PLAIN not in r.getMessage() for r in caplog.records)
