"""A stored response is continued only by the tenant that created it.

``previous_response_id`` names a conversation one worker holds; the id is no password.
The gateway records, with the binding of each response id it relays, the scope of the
request that created it (``core.session.owned``), and answers a continuation from
any other scope with the worker's own 404 for an unknown id: never forwarded.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from kvgate.gateway.dataplane.relay import WORKER_HEADER
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.store import MemoryStore
from kvgate.store.base import AffinityStore
from kvgate.testing_redis import RedisServer, find_redis_server
from kvgate.workersim.runner import WorkerHandle

from .conftest import every_worker_up, gateway_config, worker_fleet

pytestmark = pytest.mark.usefixtures("both_servers")

ALICE, BOB = "sk-alice-0123456789", "sk-bob-9876543210"


@contextlib.contextmanager
def _redis() -> Iterator[str]:
    if find_redis_server() is None:
        pytest.skip("redis-server not installed")
    with RedisServer() as server:
        yield server.url


@contextlib.asynccontextmanager
async def _gateway(
    backend: str, fleet: list[WorkerHandle], **overrides: Any
) -> AsyncIterator[GatewayHandle]:
    with contextlib.ExitStack() as stack:
        parts: dict[str, Any] = {}
        if backend == "memory":
            parts["store"] = MemoryStore()
        else:
            overrides["store"] = {
                **overrides.get("store", {}),
                "url": stack.enter_context(_redis()),
                "timeout_s": 1.0,
                "connect_timeout_s": 2.0,
            }
        async with running_gateway(gateway_config(fleet, **overrides), **parts) as gw:
            await every_worker_up(gw)
            yield gw


def _client(gw: GatewayHandle, key: str, **headers: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.openai_base, api_key=key, max_retries=0, default_headers=headers)


async def _refused(oai: AsyncOpenAI, previous: str) -> dict[str, Any]:
    """The error a continuation of ``previous`` gets; it must be the gateway's own."""
    with pytest.raises(openai.NotFoundError) as caught:
        await oai.responses.create(model="demo", input="and?", previous_response_id=previous)
    assert WORKER_HEADER.lower() not in {k.lower() for k in caught.value.response.headers}
    body: dict[str, Any] = caught.value.response.json()
    return body


async def _bound_keys(store: AffinityStore, fleet: list[WorkerHandle]) -> set[str]:
    return {a.session_key for w in fleet for a in await store.sessions_of(w.url)}


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_another_tenant_cannot_continue_a_response(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with (
        worker_fleet(2) as fleet,
        _gateway(backend, fleet, api_keys=[ALICE, BOB]) as gw,
        _client(gw, ALICE) as alice,
        _client(gw, BOB) as bob,
    ):
        first = await alice.responses.create(model="demo", input="my secret plan")
        streamed = await alice.responses.create(model="demo", input="more", stream=True)
        streamed_id = [event async for event in streamed][-1].response.id
        # Not once in many tries (a worker picked by the policy would hold it 1 time in 2).
        errors = [await _refused(bob, first.id) for _ in range(6)]
        errors.append(await _refused(bob, streamed_id))
        unknown = await _refused(bob, "resp_0123456789abcdef0123456789abcdef")
        # Alice's own continuations still go to the worker holding them.
        follow = await alice.responses.create(
            model="demo", input="go on", previous_response_id=first.id
        )
        again = await alice.responses.create(
            model="demo", input="go on", previous_response_id=streamed_id
        )
        async with aiohttp.ClientSession() as session:
            # What a worker itself answers for an id it does not hold.
            direct = {"model": "demo", "input": "x", "previous_response_id": first.id + "x"}
            async with session.post(fleet[0].url + "/v1/responses", json=direct) as resp:
                assert resp.status == 404
                from_worker = await resp.json()
            async with session.get(
                gw.url + "/metrics", headers={"Authorization": f"Bearer {ALICE}"}
            ) as resp:
                metrics = await resp.text()
        keys = await _bound_keys(gw.gateway.store, fleet)
    assert follow.status == "completed" and again.status == "completed"
    for error, previous in zip(errors, [first.id] * 6 + [streamed_id], strict=True):
        assert error == _like(unknown, "resp_0123456789abcdef0123456789abcdef", previous)
    assert error["error"]["param"] == "previous_response_id"
    assert error["error"]["type"] == "invalid_request_error"
    # The same answer as the worker's for an id it does not have: nothing says it exists.
    assert error == _like(from_worker, first.id + "x", streamed_id)
    assert keys and all(k.startswith("owned:") for k in keys), keys
    for secret in (ALICE, BOB):
        assert secret not in metrics and secret not in caplog.text
        assert all(secret not in key for key in keys)


def _like(body: dict[str, Any], was: str, now: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(json.dumps(body).replace(was, now))
    return result


async def test_behind_an_auth_proxy_the_identity_owns_its_responses() -> None:
    """One proxy token for everyone: the identity header says whose a response is, and a
    user's rotated tokens keep their conversations."""
    features = {"session_scope": {"header": "X-User-Id", "trusted_peers": ["127.0.0.0/8", "::1"]}}
    async with (
        worker_fleet(2) as fleet,
        _gateway("memory", fleet, features=features) as gw,
        _client(gw, "jwt-alice-1", **{"X-User-Id": "alice"}) as alice,
        _client(gw, "jwt-alice-2", **{"X-User-Id": "alice"}) as rotated,
        _client(gw, "jwt-alice-1", **{"X-User-Id": "bob"}) as bob,
        _client(gw, "jwt-alice-1") as nobody,
    ):
        first = await alice.responses.create(model="demo", input="my secret plan")
        follow = await rotated.responses.create(
            model="demo", input="go on", previous_response_id=first.id
        )
        await _refused(bob, first.id)
        await _refused(bob, follow.id)
        await _refused(nobody, first.id)  # no identity: owns and continues nothing
    assert follow.status == "completed"


async def test_an_unknown_owner_is_not_forwarded() -> None:
    """A response the gateway holds no record of (forgotten: its TTL ran out, evicted, or
    created before owners were recorded) is not forwarded to a worker picked by the
    policy, where a stranger retrying would reach the holder 1 time in N."""
    store = MemoryStore()
    async with worker_fleet(2) as fleet:
        config = gateway_config(fleet, api_keys=[ALICE])
        async with running_gateway(config, store=store) as gw, _client(gw, ALICE) as alice:
            await every_worker_up(gw)
            first = await alice.responses.create(model="demo", input="hello")
            for key in await _bound_keys(store, fleet):
                await store.delete(key)
            await _refused(alice, first.id)


async def test_session_scope_none_continues_whoever_names_the_id() -> None:
    """``none`` is one tenant: no owner is checked (documented)."""
    async with (
        worker_fleet(2) as fleet,
        _gateway("memory", fleet, features={"session_scope": "none"}) as gw,
        _client(gw, ALICE) as alice,
        _client(gw, BOB) as bob,
    ):
        first = await alice.responses.create(model="demo", input="hello")
        follow = await bob.responses.create(
            model="demo", input="go on", previous_response_id=first.id
        )
        keys = await _bound_keys(gw.gateway.store, fleet)
    assert follow.status == "completed"
    assert {f"response:{first.id}", f"response:{follow.id}"} <= keys


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_stored_response_is_retrieved_by_its_creator_only(backend: str) -> None:
    """``GET /v1/responses/{id}`` answers the stored response itself: it went wherever the
    policy sent it (the holder 1 time in N, for its owner or anyone). Now it goes to the
    worker holding it, in its creator's scope only."""
    async with (
        worker_fleet(2) as fleet,
        _gateway(backend, fleet, api_keys=[ALICE, BOB]) as gw,
        _client(gw, ALICE) as alice,
        _client(gw, BOB) as bob,
    ):
        first = await alice.responses.create(model="demo", input="my secret plan")
        for _ in range(4):
            with pytest.raises(openai.NotFoundError) as caught:
                await bob.responses.retrieve(first.id)
            assert WORKER_HEADER.lower() not in {k.lower() for k in caught.value.response.headers}
            assert caught.value.response.json()["error"]["message"] == (
                f"Response with id '{first.id}' not found."
            )
        mine = [await alice.responses.retrieve(first.id) for _ in range(4)]
    assert all(m.id == first.id and m.output_text == first.output_text for m in mine)


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_deleted_response_is_forgotten(backend: str) -> None:
    """``DELETE /v1/responses/{id}`` that its worker confirms drops the id's record: the id
    is then the gateway's own 404 (it kept the record until its TTL, and forwarded every
    later request about the id to the worker). A refused or failed delete keeps it."""
    async with (
        worker_fleet(2) as fleet,
        _gateway(backend, fleet, api_keys=[ALICE, BOB]) as gw,
        _client(gw, ALICE) as alice,
        _client(gw, BOB) as bob,
    ):
        first = await alice.responses.create(model="demo", input="my secret plan")
        kept = await alice.responses.create(model="demo", input="another")
        with pytest.raises(openai.NotFoundError):
            await bob.responses.delete(first.id)  # not his: the record stays
        assert (await alice.responses.retrieve(first.id)).id == first.id
        before = await _bound_keys(gw.gateway.store, fleet)
        await alice.responses.delete(first.id)
        after = await _bound_keys(gw.gateway.store, fleet)
        for ask in (
            alice.responses.retrieve(first.id),
            alice.responses.delete(first.id),
        ):
            with pytest.raises(openai.NotFoundError) as caught:
                await ask
            headers = {k.lower() for k in caught.value.response.headers}
            assert WORKER_HEADER.lower() not in headers  # the gateway's, no worker asked
        await _refused(alice, first.id)
        assert (await alice.responses.retrieve(kept.id)).id == kept.id
    assert len(before - after) == 1 and after < before


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_tenants_flood_leaves_anothers_bindings(backend: str) -> None:
    """Bob sending ever new session ids and responses evicted Alice's session binding and
    her response's owner from the bounded store (her continuation then a 404); in Redis he
    could make the gateway hold as many as he sent. Now his own oldest go."""
    overrides: dict[str, Any] = {"api_keys": [ALICE, BOB]}
    if backend == "memory":
        store: AffinityStore | None = MemoryStore(max_sessions=12)
    else:
        store, overrides["store"] = None, {"max_sessions_per_scope": 6}
    async with worker_fleet(2) as fleet, contextlib.AsyncExitStack() as stack:
        if store is None:
            gw = await stack.enter_async_context(_gateway(backend, fleet, **overrides))
        else:
            gw = await stack.enter_async_context(
                running_gateway(gateway_config(fleet, **overrides), store=store)
            )
            await every_worker_up(gw)
        alice = await stack.enter_async_context(_client(gw, ALICE))
        bob = await stack.enter_async_context(_client(gw, BOB))
        first = await alice.responses.create(model="demo", input="my plan")
        chat = [{"role": "user", "content": "hello"}]
        mine = await alice.chat.completions.create(
            model="demo", messages=chat, extra_headers={"X-Session-ID": "alice-1"}
        )
        for n in range(30):
            if n % 3:
                await bob.chat.completions.create(
                    model="demo", messages=chat, extra_headers={"X-Session-ID": f"bob-{n}"}
                )
            else:
                await bob.responses.create(model="demo", input=f"flood {n}")
        follow = await alice.responses.create(
            model="demo", input="go on", previous_response_id=first.id
        )
        again = await alice.chat.completions.with_raw_response.create(
            model="demo", messages=chat, extra_headers={"X-Session-ID": "alice-1"}
        )
        keys = await _bound_keys(gw.gateway.store, fleet)
    assert follow.status == "completed"
    assert mine.id and again.headers["x-kvgate-route-reason"] == "affinity_hit"
    assert len(keys) <= 12, keys
