"""Reload in operation: POST /admin/reload and SIGHUP change weights without a dropped request."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Collection
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from pydantic import Field

from kvgate.core.features import RequestFeatures
from kvgate.core.policies import default_registry
from kvgate.core.policies.round_robin import RoundRobin, RoundRobinConfig
from kvgate.core.registry import PolicyRegistry, PolicySpec
from kvgate.gateway.config import ConfigSource, load_config
from kvgate.gateway.observe.federation import MetricsPeers
from kvgate.gateway.server import _reload, serve
from kvgate.gateway.testing import running_gateway
from kvgate.testing import wait_until
from kvgate.types import WorkerId
from kvgate.workersim.runner import WorkerHandle

from .conftest import gateway_config, worker_fleet

BODY = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _write(path: Path, fleet: list[WorkerHandle], weights: dict[str, int], **extra: Any) -> None:
    config = gateway_config(fleet, **extra)
    config["workers"] = [
        {"url": w.url, "version": v} for w, v in zip(fleet, ("v1", "v2"), strict=True)
    ]
    config["models"] = {"demo": {"weights": weights}}
    path.write_text(yaml.safe_dump(config))


async def _version(session: aiohttp.ClientSession, base: str) -> tuple[int, str]:
    async with session.post(base + "/v1/chat/completions", json=BODY) as resp:
        await resp.read()
        return resp.status, resp.headers.get("X-Kvgate-Model-Version", "")


async def test_admin_reload_moves_weights_under_traffic_and_refuses_restart_keys(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kvgate.yaml"
    async with worker_fleet(2) as fleet:
        _write(path, fleet, {"v1": 100, "v2": 0})
        source = ConfigSource(path)
        async with (
            running_gateway(source(), source=source) as gw,
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: all(w.probe_ok for w in gw.gateway.pool), message="up")
            results: list[tuple[int, str]] = []
            stop = asyncio.Event()

            async def traffic() -> None:
                while not stop.is_set():
                    results.append(await _version(session, gw.url))

            load = asyncio.create_task(traffic())
            await wait_until(lambda: len(results) >= 5, message="traffic before")
            _write(path, fleet, {"v1": 0, "v2": 100})
            async with session.post(gw.url + "/admin/reload") as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["changed"] == ["models.demo"]
            before = len(results)
            await wait_until(lambda: len(results) >= before + 10, message="traffic after")
            stop.set()
            await load
            assert {status for status, _ in results} == {200}  # not one request dropped
            assert {v for _, v in results[:5]} == {"v1"}
            assert {v for _, v in results[before + 2 :]} == {"v2"}

            # A key that needs a restart: refused by name, nothing applied.
            _write(path, fleet, {"v1": 50, "v2": 50}, limits={"max_headers": 64})
            async with session.post(gw.url + "/admin/reload") as resp:
                assert resp.status == 409
                error = (await resp.json())["error"]
            assert error["code"] == "reload_refused"
            assert "cannot change without a restart: limits" in error["message"]
            assert gw.gateway.control.versions.get("demo").weights["v2"] == 100  # type: ignore[union-attr]


async def test_reload_adds_and_drains_workers_and_rebuilds_policy_options(tmp_path: Path) -> None:
    path = tmp_path / "kvgate.yaml"
    async with worker_fleet(2) as fleet:
        path.write_text(yaml.safe_dump(gateway_config(fleet[:1])))
        source = ConfigSource(path)
        async with running_gateway(source(), source=source) as gw:
            old_policy = gw.gateway.policy
            config = gateway_config(fleet[1:], policy={"name": "least_request", "options": {}})
            path.write_text(yaml.safe_dump(config))
            refused = await _try(gw.gateway.reloader.reload_source())
            assert "policy.name" in refused  # a different policy needs a restart
            assert [w.id for w in gw.gateway.pool] == [fleet[0].url]  # nothing applied
            path.write_text(yaml.safe_dump(gateway_config(fleet[1:])))
            result = await gw.gateway.reloader.reload_source()
            assert result.added == [fleet[1].url] and result.removed == [fleet[0].url]
            assert [w.id for w in gw.gateway.pool] == [fleet[1].url]
            assert gw.gateway.policy is old_policy  # options unchanged: the same policy
            options = {"name": "default", "options": {"evict": 2.0}}
            path.write_text(yaml.safe_dump(gateway_config(fleet[1:], policy=options)))
            result = await gw.gateway.reloader.reload_source()
            assert result.changed == ["policy.options"]
            new_policy = gw.gateway.policy
            assert new_policy is not old_policy
            assert gw.gateway.router.policy is new_policy


async def _try(call: Any) -> str:
    try:
        await call
    except Exception as exc:
        return str(exc)
    raise AssertionError("the reload was not refused")


async def test_sighup_rereads_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "kvgate.yaml"
    async with worker_fleet(2) as fleet:
        _write(path, fleet, {"v1": 100, "v2": 0}, listen={"port": 0})
        stop = asyncio.Event()
        ports: list[int] = []
        config, source = load_config(path), ConfigSource(path)
        server = asyncio.create_task(
            serve(config, source=source, stop=stop, on_listening=ports.append)
        )
        try:
            await wait_until(lambda: bool(ports), message="listening")
            base = f"http://127.0.0.1:{ports[0]}"
            _write(path, fleet, {"v1": 0, "v2": 100}, listen={"port": 0})
            os.kill(os.getpid(), signal.SIGHUP)
            async with aiohttp.ClientSession() as session:

                async def weights() -> bool:
                    async with session.get(base + "/admin/models") as resp:
                        models = (await resp.json())["models"]
                    return models["demo"]["weights"] == {"v1": 0.0, "v2": 100.0}

                await wait_until(weights, message="weights reloaded on SIGHUP")
                status, version = await _version(session, base)
            assert (status, version) == (200, "v2")
        finally:
            stop.set()
            await server


class ProbeConfig(RoundRobinConfig):
    tag: int = Field(default=0, ge=0)


class Probe(RoundRobin):
    """Round robin that counts what the gateway asks of this instance."""

    def __init__(self, config: ProbeConfig) -> None:
        super().__init__(config)
        self.tag = config.tag
        self.asked = 0

    def openers(self) -> Collection[str]:
        self.asked += 1  # the warm-ups ask after every placement
        return ()

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: float) -> None:
        self.asked += 1


def probe_registry(built: list[Probe]) -> PolicyRegistry:
    def factory(config: ProbeConfig) -> Probe:
        built.append(Probe(config))
        return built[-1]

    spec = PolicySpec("probe", ProbeConfig, factory)
    return PolicyRegistry([*default_registry().values(), spec])


async def test_a_reload_swaps_the_policy_for_every_reader_from_the_gateways_registry(
    tmp_path: Path,
) -> None:
    """Issue 45.8: the warm-ups kept the old policy after a reload, and a reload rebuilt
    the policy from the default registry (a gateway's own policy failed to reload)."""
    path = tmp_path / "kvgate.yaml"
    built: list[Probe] = []
    async with worker_fleet(2) as fleet:
        policy = {"name": "probe", "options": {"tag": 1}}
        path.write_text(yaml.safe_dump(gateway_config(fleet, policy=policy)))
        source = ConfigSource(path)
        registry = probe_registry(built)
        async with (
            running_gateway(source(), source=source, registry=registry) as gw,
            aiohttp.ClientSession() as session,
        ):
            await wait_until(lambda: all(w.probe_ok for w in gw.gateway.pool), message="up")
            assert (await _version(session, gw.url))[0] == 200
            policy["options"] = {"tag": 2}
            path.write_text(yaml.safe_dump(gateway_config(fleet, policy=policy)))
            async with session.post(gw.url + "/admin/reload") as resp:
                assert resp.status == 200, await resp.text()
            old, new = built
            assert (old.tag, new.tag) == (1, 2)
            asked = old.asked
            for _ in range(4):
                assert (await _version(session, gw.url))[0] == 200
            assert old.asked == asked  # nobody reads the old policy any more
            assert new.asked >= 8  # routed and warm-up openers, each request
            assert gw.gateway.policy is new


async def test_a_bad_policy_option_is_a_409_naming_it_and_sighup_logs_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 45.9: ``stay: -3`` answered 500 with a traceback (SIGHUP: "Task exception
    was never retrieved"); it is refused like every other reload, nothing applied.
    (The default policy's ``stay`` is gone: ``evict`` takes its place here.)"""
    path = tmp_path / "kvgate.yaml"
    async with worker_fleet(2) as fleet:
        path.write_text(yaml.safe_dump(gateway_config(fleet)))
        source = ConfigSource(path)
        async with (
            running_gateway(source(), source=source) as gw,
            aiohttp.ClientSession() as session,
        ):
            before = gw.gateway.policy
            bad = {"name": gw.gateway.config.policy.name, "options": {"evict": -3}}
            path.write_text(yaml.safe_dump(gateway_config(fleet, policy=bad)))
            async with session.post(gw.url + "/admin/reload") as resp:
                assert resp.status == 409, await resp.text()
                error = (await resp.json())["error"]
            assert error["code"] == "reload_refused"
            assert "policy.options.evict" in error["message"]
            assert gw.gateway.policy is before
            caplog.clear()
            with caplog.at_level(logging.INFO):
                await _reload(gw.gateway)  # what SIGHUP runs
            refused = [r for r in caplog.records if "policy.options.evict" in r.getMessage()]
            assert refused and all(r.exc_info is None for r in caplog.records)


async def test_a_reload_that_misses_a_process_says_which(tmp_path: Path) -> None:
    """Issue 45.7: with several processes a reload must reach all or say which it did not.
    Here process 1 has no socket (it is gone): this process reloads, the answer is a 503
    naming process 1, with every process's entry beside the error."""
    path = tmp_path / "kvgate.yaml"
    async with worker_fleet(2) as fleet:
        _write(path, fleet, {"v1": 100, "v2": 0})
        source = ConfigSource(path)
        async with (
            running_gateway(source(), source=source) as gw,
            aiohttp.ClientSession() as session,
        ):
            gw.gateway.peers = MetricsPeers(tmp_path, 0, 2)
            _write(path, fleet, {"v1": 0, "v2": 100})
            async with session.post(gw.url + "/admin/reload") as resp:
                assert resp.status == 503
                answer = await resp.json()
            assert answer["error"]["code"] == "reload_incomplete"
            assert "process 1 unreachable" in answer["error"]["message"]
            assert [(p["process"], p["status"]) for p in answer["processes"]] == [
                (0, "reloaded"),
                (1, "unreachable"),
            ]
            assert gw.gateway.control.versions.get("demo").weights["v2"] == 100  # type: ignore[union-attr]
