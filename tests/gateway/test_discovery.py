"""DNS discovery against a real DNS server on loopback: join, leave (drained), outages."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.control.config import DiscoveryConfig, DnsTarget
from kvgate.gateway.control.discovery import DnsResolver, plan
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import wait_until
from kvgate.workersim import WorkerOptions, running_worker
from kvgate.workersim.runner import WorkerHandle

from .conftest import FAST, gateway_config
from .dns_server import dns_server

INTERVAL = 0.3


def test_plan_adds_new_keeps_failed_and_never_touches_static() -> None:
    configs = {u: WorkerConfig(url=u) for u in ("http://a:1", "http://b:1", "http://s:1")}
    owned = {"http://a:1": "x", "http://c:1": "y"}
    change = plan(
        owned,
        {"x": frozenset({"http://b:1", "http://s:1"}), "y": None},
        configs,
        taken=["http://s:1"],
    )
    assert [w.url for w in change.add] == ["http://b:1"]  # s is static: not added twice
    assert change.remove == ("http://a:1",)  # c's lookup failed: kept


@contextlib.asynccontextmanager
async def same_port_workers(count: int) -> AsyncIterator[list[WorkerHandle]]:
    """Workers on 127.0.0.1, 127.0.0.2, ... all on one port, as pods behind a Service."""
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(
            running_worker(WorkerOptions(host="127.0.0.1", port=0, seed=0, **FAST))
        )
        handles = [first]
        port = int(first.url.rsplit(":", 1)[1])
        for i in range(1, count):
            opts = WorkerOptions(host=f"127.0.0.{i + 1}", port=port, seed=i, **FAST)
            handles.append(await stack.enter_async_context(running_worker(opts)))
        yield handles


async def _chat(session: aiohttp.ClientSession, gw: GatewayHandle) -> int:
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with session.post(gw.openai_base + "/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


async def test_workers_join_and_leave_with_dns_without_a_dropped_request() -> None:
    async with same_port_workers(2) as fleet:
        port = int(fleet[0].url.rsplit(":", 1)[1])
        with dns_server() as (zone, server):
            zone.a["vllm.test"] = ["127.0.0.1"]
            discovery = {
                "dns": [{"name": "vllm.test", "port": port}],
                "interval_s": INTERVAL,
                "nameservers": [server],
                "timeout_s": 1.0,
            }
            config = gateway_config([], discovery=discovery)
            async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
                found = gw.gateway.control.discovery
                pool = gw.gateway.pool
                await wait_until(gw.gateway.ready, message="first worker found")
                assert [w.id for w in pool] == [fleet[0].url]

                # Traffic all along: nothing may fail while the fleet changes.
                statuses: list[int] = []
                stop = asyncio.Event()

                async def traffic() -> None:
                    while not stop.is_set():
                        statuses.append(await _chat(session, gw))

                load = asyncio.create_task(traffic())
                rounds = found.rounds
                zone.a["vllm.test"] = ["127.0.0.1", "127.0.0.2"]
                await wait_until(lambda: len(pool) == 2, message="second worker joins")
                # The round running when the record changed may have resolved before it:
                # the change is picked up by the next one, i.e. within one interval.
                assert found.rounds <= rounds + 2
                rounds = found.rounds
                zone.a["vllm.test"] = ["127.0.0.2"]
                await wait_until(lambda: len(pool) == 1, message="first worker leaves")
                assert found.rounds <= rounds + 2
                assert [w.id for w in pool] == [fleet[1].url]
                await wait_until(lambda: len(statuses) >= 20 or False, message="traffic")
                stop.set()
                await load
                assert set(statuses) == {200}, statuses

                # A sick DNS server changes nothing; a vanished name empties the fleet.
                zone.failing = True
                failures = found.failures
                await wait_until(lambda: found.failures >= failures + 2, message="failures")
                assert len(pool) == 1
                zone.failing = False
                del zone.a["vllm.test"]
                await wait_until(lambda: len(pool) == 0, message="name gone")
                assert await _chat(session, gw) == 503


async def test_srv_records_give_host_and_port() -> None:
    async with contextlib.AsyncExitStack() as stack:
        fleet = [
            await stack.enter_async_context(running_worker(WorkerOptions(port=0, seed=i, **FAST)))
            for i in range(2)
        ]
        ports = [int(w.url.rsplit(":", 1)[1]) for w in fleet]
        with dns_server() as (zone, server):
            zone.srv["_http._tcp.vllm.test"] = [("localhost", p) for p in ports]
            config = DiscoveryConfig(
                dns=[DnsTarget(name="_http._tcp.vllm.test", record="SRV")], nameservers=[server]
            )
            found = await DnsResolver(config).addresses(config.dns[0])
    assert found == {f"http://localhost:{p}" for p in ports}


async def test_aaaa_records_are_read_beside_a() -> None:
    with dns_server() as (zone, server):
        zone.a["both.test"] = ["10.0.0.1", "fd00::1"]
        config = DiscoveryConfig(dns=[DnsTarget(name="both.test", port=8000)], nameservers=[server])
        found = await DnsResolver(config).addresses(config.dns[0])
    assert found == {"http://10.0.0.1:8000", "http://[fd00::1]:8000"}


def test_a_record_target_needs_a_port() -> None:
    with pytest.raises(ValueError, match="record A needs a port"):
        DnsTarget(name="x.test")
