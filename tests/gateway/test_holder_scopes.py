"""The prefix blocks a request shares with other replicas are counted against its tenant
(``store.max_holders_per_scope``): the gateway hands the store the request's tenant."""

from __future__ import annotations

import aiohttp
from multidict import CIMultiDict

from kvgate.core.prefix import FeatureConfig, build_features
from kvgate.core.session import IDENTITY_TAG, HeaderScope, tenant_tag
from kvgate.gateway.testing import running_gateway
from kvgate.store import MemoryStore
from kvgate.workersim.runner import WorkerHandle

from .conftest import every_worker_up, gateway_config


async def test_a_tenants_new_prompts_are_bounded_and_leave_anothers_evidence(
    workers: list[WorkerHandle],
) -> None:
    config = gateway_config(workers, store={"max_holders_per_scope": 3})
    async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
        await every_worker_up(gw)

        async def ask(key: str, n: int) -> None:
            words = " ".join(f"{key}-{n}-{i}" for i in range(300))  # blocks past a checkpoint
            body = {"model": "demo", "prompt": words, "max_tokens": 1}
            headers = {"Authorization": f"Bearer {key}"}
            async with session.post(
                gw.openai_base + "/completions", json=body, headers=headers
            ) as r:
                assert r.status == 200, await r.text()

        await ask("sk-bob", 0)
        store = gw.gateway.store
        assert isinstance(store, MemoryStore)
        bob = store.holders.held_by(tenant_tag(b"sk-bob"))
        assert bob >= 2  # a prompt of several checkpoints
        for n in range(6):
            await ask("sk-alice", n)
        assert store.holders.held_by(tenant_tag(b"sk-alice")) == 3
        assert store.holders.held_by(tenant_tag(b"sk-bob")) == min(bob, 3)


def test_a_requests_tenant_is_its_scopes_with_a_session_id_or_without() -> None:
    """The tenant its shared blocks count against is its scope's tag, whether read off its
    session key or made from its headers; nobody's without a scope."""
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    bob = tenant_tag(b"sk-bob")
    cases = [
        ({"Authorization": "Bearer sk-bob"}, "credential", bob),
        ({"Authorization": "Bearer sk-bob", "X-Session-ID": "s1"}, "credential", bob),
        ({"x-api-key": "sk-bob", "X-Session-ID": "cred:posing"}, "credential", bob),
        ({"X-Session-ID": "cred:posing"}, "credential", ""),
        ({}, "credential", ""),
        ({"Authorization": "Bearer sk-bob", "X-Session-ID": "s1"}, "none", ""),
    ]
    for headers, scope, tenant in cases:
        cfg = FeatureConfig(session_scope=scope)
        made = build_features(body, CIMultiDict(headers), cfg, request_id="r")
        assert made.tenant == tenant, (headers, scope)
    identity = FeatureConfig(
        session_scope=HeaderScope(header="x-user-id", trusted_peers=("10.0.0.0/8",))
    )
    for extra in ({}, {"X-Session-ID": "s1"}):
        headers = CIMultiDict({"x-user-id": "alice", **extra})
        made = build_features(body, headers, identity, request_id="r", peer="10.0.0.7")
        assert made.tenant == tenant_tag(IDENTITY_TAG + b"alice")
        stranger = build_features(body, headers, identity, request_id="r", peer="192.0.2.1")
        assert stranger.tenant == ""
