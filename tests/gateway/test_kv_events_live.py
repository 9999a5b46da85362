"""The live gateway on KV events: emulated workers publish their caches, the gateway
asks their ``/tokenize`` (``tokenizers: {kind: worker}``), and the default policy
routes a prompt to the worker whose engine holds it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.default import DefaultPolicy
from kvgate.core.policy import Resident, RouteContext
from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.control.config import DnsTarget
from kvgate.gateway.control.discovery import worker_config
from kvgate.gateway.testing import running_gateway
from kvgate.testing import free_port_pair, wait_until
from kvgate.workersim import WorkerOptions, running_worker
from kvgate.workersim.runner import WorkerHandle

from .conftest import gateway_config


class Spy(DefaultPolicy):
    """The default policy, keeping what the driver told it of each request."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[RequestFeatures, Resident | None]] = []

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        self.seen.append((request, ctx.resident))
        return super().pick(request, ctx)


@contextlib.asynccontextmanager
async def publishing_fleet(count: int) -> AsyncIterator[list[tuple[WorkerHandle, int]]]:
    async with contextlib.AsyncExitStack() as stack:
        fleet = []
        for seed in range(count):
            port = free_port_pair()
            options = WorkerOptions(
                port=0, profile="fast", kv_blocks=256, seed=seed, kv_events_port=port
            )
            fleet.append((await stack.enter_async_context(running_worker(options)), port))
        yield fleet


def _config(fleet: list[tuple[WorkerHandle, int]]) -> dict[str, Any]:
    config = gateway_config([w for w, _ in fleet], tokenizers={"demo": {"kind": "worker"}})
    config["workers"] = [
        {
            "url": w.url,
            "kv_events": f"tcp://127.0.0.1:{port}",
            "kv_events_replay": f"tcp://127.0.0.1:{port + 1}",
        }
        for w, port in fleet
    ]
    return config


async def _chat(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> str:
    body = {"model": "demo", "messages": messages, "max_tokens": 2}
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return r.headers["X-Kvgate-Worker"]


async def test_a_prompt_goes_where_the_engine_holds_it() -> None:
    system = {"role": "system", "content": "You answer in one word. " * 60}
    async with publishing_fleet(3) as fleet:
        policy = Spy()
        async with running_gateway(_config(fleet), policy=policy) as gw:
            await wait_until(gw.gateway.ready, timeout=10)
            async with aiohttp.ClientSession() as session:
                first = await _chat(session, gw.url, [system, {"role": "user", "content": "a?"}])
                holder = next(w for w, _ in fleet if w.url == first)
                caches = gw.gateway.caches
                await wait_until(lambda: caches.index.blocks(first) > 0, timeout=10)
                # The gateway's tokens are the worker's own.
                request, _ = policy.seen[0]
                async with session.post(
                    holder.url + "/tokenize",
                    json={"model": "demo", "messages": [system, {"role": "user", "content": "a?"}]},
                ) as r:
                    assert tuple((await r.json())["tokens"]) == request.token_ids
                second = await _chat(session, gw.url, [system, {"role": "user", "content": "b?"}])
            exposed = gw.gateway.metrics.render().decode()
            assert f'kvgate_kv_events_blocks{{worker="{first}"}}' in exposed
            assert "kvgate_kv_events_batches_total" in exposed
            assert "kvgate_kv_events_garbage_total" in exposed
        assert second == first
        _, resident = policy.seen[-1]
        assert resident is not None
        assert set(resident.exact) == {w.url for w, _ in fleet}
        assert resident.chars.get(first, 0) > len(system["content"]) // 2
        assert all(resident.chars.get(w.url, 0) == 0 for w, _ in fleet if w.url != first)


def test_discovered_workers_publish_on_the_configured_ports() -> None:
    target = DnsTarget(name="vllm", port=8000, kv_events_port=5557, kv_events_replay_port=5558)
    config = worker_config(target, "http://10.0.0.5:8000")
    assert config.kv_events == "tcp://10.0.0.5:5557"
    assert config.kv_events_replay == "tcp://10.0.0.5:5558"
    assert (
        worker_config(DnsTarget(name="vllm", port=8000), "http://10.0.0.5:8000").kv_events is None
    )


async def test_a_worker_added_while_running_is_followed() -> None:
    async with publishing_fleet(1) as fleet:
        ((worker, port),) = fleet
        async with running_gateway(gateway_config([])) as gw:
            caches = gw.gateway.caches
            added = WorkerConfig(
                url=worker.url,
                kv_events=f"tcp://127.0.0.1:{port}",
                kv_events_replay=f"tcp://127.0.0.1:{port + 1}",
            )
            await gw.gateway.control.membership.add(added)
            async with aiohttp.ClientSession() as session:
                await _chat(session, gw.url, [{"role": "user", "content": "hello " * 80}])
            await wait_until(lambda: caches.index.blocks(worker.url) > 0, timeout=10)
            await gw.gateway.control.membership.remove(worker.url)
            assert not caches.index.tracks(worker.url)
