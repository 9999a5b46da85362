"""Session ids are the client's to choose: two clients with the same id stay apart."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from kvgate.gateway.dataplane.relay import WORKER_HEADER
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.store import MemoryStore
from kvgate.testing import wait_until
from kvgate.workersim.runner import WorkerHandle

from .conftest import every_worker_up, gateway_config, worker_fleet

KEYS = ("sk-alice-0123456789", "sk-bob-9876543210")


async def test_two_clients_sending_one_session_id_get_independent_affinities(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    store = MemoryStore()
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        worker_fleet(2) as (a, b),
        running_gateway(gateway_config([a, b], api_keys=list(KEYS)), store=store) as gw,
        aiohttp.ClientSession() as session,
    ):
        await wait_until(gw.gateway.ready, message="gateway ready")
        await every_worker_up(gw)
        for api_key in KEYS:
            headers = {"X-Session-ID": "shared", "Authorization": f"Bearer {api_key}"}
            url = gw.openai_base + "/chat/completions"
            async with session.post(url, json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
        async with session.get(
            gw.url + "/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}
        ) as resp:
            metrics = await resp.text()
        bound = [s for w in (a.url, b.url) for s in await store.sessions_of(w)]
    keys = {affinity.session_key for affinity in bound}
    assert len(keys) == 2, keys  # one binding each, not one shared
    assert await store.get("shared") is None
    for api_key in KEYS:
        assert all(api_key not in k for k in keys)
        assert api_key not in metrics
        assert api_key not in caplog.text


IDENTITIES = ("user-alice-7f3a9c", "user-bob-51d2e8")
"""What an auth proxy sets in ``X-User-Id`` (never to be shown anywhere)."""


def _header_scope(trusted: list[str]) -> dict[str, Any]:
    return {"session_scope": {"header": "X-User-Id", "trusted_peers": trusted}}


async def _bound(store: MemoryStore, fleet: list[WorkerHandle]) -> set[str]:
    return {a.session_key for w in fleet for a in await store.sessions_of(w.url)}


@pytest.mark.usefixtures("both_servers")
async def test_behind_an_auth_proxy_sessions_are_scoped_by_its_identity_header(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The proxy replaces every client's credential with its own and sets ``X-User-Id``:
    by credential, two users sending one session id shared a binding (and a slot); by the
    identity header they do not, and a user's rotated tokens keep its session."""
    caplog.set_level(logging.DEBUG)
    store = MemoryStore()
    config = gateway_config(
        [], api_keys=["proxy-token-0123456789"], features=_header_scope(["127.0.0.1/32"])
    )
    async with worker_fleet(2) as fleet:
        config["workers"] = [{"url": w.url} for w in fleet]
        async with running_gateway(config, store=store) as gw:
            await every_worker_up(gw)
            homes: dict[str, set[str]] = {}
            for identity in IDENTITIES:
                async with AsyncOpenAI(
                    base_url=gw.openai_base,
                    api_key="proxy-token-0123456789",
                    max_retries=0,
                    default_headers={"X-Session-ID": "shared", "x-user-id": identity},
                ) as oai:
                    for turn in range(3):
                        raw = await oai.chat.completions.with_raw_response.create(
                            model="demo",
                            max_tokens=2,
                            messages=[{"role": "user", "content": f"{identity} turn {turn}"}],
                        )
                        homes.setdefault(identity, set()).add(raw.headers[WORKER_HEADER])
            bound = await _bound(store, fleet)
            assert len(bound) == 2, bound  # one binding each, not one shared
            assert all(len(workers) == 1 for workers in homes.values()), homes
            # Short-lived tokens rotated under one identity (no api_keys here): one session.
            rotated = await _bound(store, fleet)
            for n in range(3):
                async with AsyncOpenAI(
                    base_url=gw.openai_base,
                    api_key="proxy-token-0123456789",
                    max_retries=0,
                    default_headers={
                        "X-Session-ID": "rotating",
                        "x-user-id": IDENTITIES[0],
                        "x-forwarded-jwt": f"eyJ.rotated-{n}",
                    },
                ) as oai:
                    await oai.chat.completions.create(
                        model="demo", max_tokens=2, messages=[{"role": "user", "content": "r"}]
                    )
            assert len(await _bound(store, fleet) - rotated) == 1
            shown = await _rendered(gw, "proxy-token-0123456789")
    for identity in IDENTITIES:
        assert all(identity not in key for key in bound)
        assert identity not in shown
        assert identity not in caplog.text


async def test_rotated_bearer_tokens_keep_their_session_by_identity() -> None:
    """Short-lived JWTs: by credential each rotation starts a new session (a new worker
    maybe, and no saved slot); by the trusted identity header, one session throughout."""
    store = MemoryStore()
    async with worker_fleet(2) as fleet:
        config = gateway_config(fleet, features=_header_scope(["127.0.0.0/8", "::1"]))
        async with running_gateway(config, store=store) as gw:
            await every_worker_up(gw)
            for n in range(4):
                async with AsyncOpenAI(
                    base_url=gw.openai_base,
                    api_key=f"eyJhbGciOiJSUzI1NiJ9.token-{n}.sig",
                    max_retries=0,
                    default_headers={"X-Session-ID": "agent-run-1", "x-user-id": "alice"},
                ) as oai:
                    await oai.chat.completions.create(
                        model="demo", max_tokens=2, messages=[{"role": "user", "content": "t"}]
                    )
            assert len(await _bound(store, fleet)) == 1


async def test_an_identity_from_an_untrusted_peer_or_sent_twice_binds_nothing() -> None:
    """A client that reaches the gateway around the proxy, or sends its own ``X-User-Id``
    beside the one a proxy appends, is not that user: its session ids are ignored."""
    store = MemoryStore()
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    responses = {"model": "demo", "input": "hi", "max_output_tokens": 2}
    cases = ((["10.0.0.0/8"], ["alice"]), (["127.0.0.1"], ["bob", "alice"]))
    async with worker_fleet(2) as fleet:
        for trusted, identity in cases:
            config = gateway_config(fleet, features=_header_scope(trusted))
            async with running_gateway(config, store=store) as gw:
                await every_worker_up(gw)
                # Raw bytes: aiohttp's and httpx's clients keep one of a repeated header.
                headers = [("X-Session-ID", "s"), *(("x-user-id", i) for i in identity)]
                for path, payload in (("/chat/completions", body), ("/responses", responses)):
                    status, head = await _post(gw, path, {**payload, "user": "u"}, headers)
                    assert status == 200, head
                    assert "affinity" not in head.lower()
            # Only the worker's own response ids are bound (``previous_response_id``'s home).
            assert {k for k in await _bound(store, fleet) if not k.startswith("response:")} == set()


async def test_session_scope_none_is_the_explicit_opt_out() -> None:
    """``none``: one tenant, ids shared whoever sends them (documented as unsafe)."""
    store = MemoryStore()
    async with worker_fleet(2) as fleet:
        config = gateway_config(fleet, features={"session_scope": "none"})
        async with running_gateway(config, store=store) as gw:
            await every_worker_up(gw)
            for key in KEYS:
                async with AsyncOpenAI(
                    base_url=gw.openai_base,
                    api_key=key,
                    max_retries=0,
                    default_headers={"X-Session-ID": "shared"},
                ) as oai:
                    await oai.chat.completions.create(
                        model="demo", max_tokens=2, messages=[{"role": "user", "content": "t"}]
                    )
            assert await _bound(store, fleet) == {"shared"}


async def _rendered(gw: GatewayHandle, key: str) -> str:
    """What the gateway shows: /metrics, the admin API's pages and the dashboard's data."""
    shown = []
    async with aiohttp.ClientSession() as session:
        for path in ("/metrics", "/admin/workers", "/admin/models", "/dashboard/state.json"):
            async with session.get(
                gw.url + path, headers={"Authorization": f"Bearer {key}"}
            ) as resp:
                assert resp.status == 200, (path, resp.status)
                shown.append(await resp.text())
    return "\n".join(shown)


async def _post(
    gw: GatewayHandle, path: str, body: dict[str, Any], headers: list[tuple[str, str]]
) -> tuple[int, str]:
    """POST ``body`` with ``headers`` exactly as given (repeats kept): status and head."""
    data = json.dumps(body).encode()
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    lines = [f"POST /v1{path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines += [f"Content-Length: {len(data)}", "Connection: close", "", ""]
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write("\r\n".join(lines).encode() + data)
        answer = await reader.read()
    finally:
        writer.close()
    head = answer.partition(b"\r\n\r\n")[0].decode()
    return int(head.split(" ", 2)[1]), head
