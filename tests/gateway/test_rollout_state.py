"""Rollout state outlives the gateway, and sessions keep their version through weight changes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from itertools import count
from typing import Any

import aiohttp
import pytest

from kvgate.core.versions import ModelVersions, VersionWeights, assign_version
from kvgate.gateway.testing import running_gateway
from kvgate.store import MemoryStore
from kvgate.testing import wait_until
from kvgate.testing_redis import RedisServer, find_redis_server

from .rollout_fleet import Traffic, admin, rollout_state, spec, versioned_fleet, wait_state

ROLLOUT = "demo/v2"


def _version(key: str, canary_percent: float) -> str:
    versions = ModelVersions(
        "demo", VersionWeights({"v1": 100 - canary_percent, "v2": canary_percent}), "v1"
    )
    return assign_version(versions, key, "unused").version


def session_key(exclude: tuple[str, ...] = (), **wanted: str) -> str:
    """A session key whose hash lands on the wanted version at each canary weight.

    ``session_key(p10="v1", p25="v2")``: v1 at a 10% canary, v2 at 25%.
    """
    for i in count():
        key = f"session-{i}"
        if key not in exclude and all(_version(key, float(p[1:])) == v for p, v in wanted.items()):
            return key
    raise AssertionError("unreachable")


async def served_by(session: aiohttp.ClientSession, base: str, key: str) -> tuple[str, str]:
    """(version, route reason) of one chat turn of session ``key``."""
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with session.post(
        base + "/v1/chat/completions", json=body, headers={"X-Session-ID": key}
    ) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["X-Kvgate-Model-Version"], resp.headers["X-Kvgate-Route-Reason"]


async def test_a_session_keeps_its_version_while_weights_change_until_rollback() -> None:
    on_canary = session_key(p10="v2")
    on_baseline = session_key(p10="v1", p25="v2")  # the hash alone would move it at 25%
    async with (
        versioned_fleet() as fleet,
        running_gateway(fleet.config()) as gw,
        aiohttp.ClientSession() as session,
    ):
        body = spec(min_step_duration_s=60.0)  # steps move by hand only
        assert (await admin(session, "POST", gw.url + "/admin/rollouts", body))[0] == 201
        assert (await served_by(session, gw.url, on_canary))[0] == "v2"
        assert (await served_by(session, gw.url, on_baseline))[0] == "v1"

        url = f"{gw.url}/admin/rollouts/{ROLLOUT}/promote?step=true"
        status, moved = await admin(session, "POST", url)
        assert status == 200, moved
        assert moved["weights"] == {"v1": 75.0, "v2": 25.0}
        assert await served_by(session, gw.url, on_canary) == ("v2", "affinity_hit")
        assert await served_by(session, gw.url, on_baseline) == ("v1", "affinity_hit")
        # A new session whose hash lies where ``on_baseline``'s does follows the new weights.
        fresh = session_key(exclude=(on_baseline,), p10="v1", p25="v2")
        assert (await served_by(session, gw.url, fresh))[0] == "v2"

        status, aborted = await admin(session, "POST", f"{gw.url}/admin/rollouts/{ROLLOUT}/abort")
        assert status == 200
        assert aborted["state"] == "aborted"
        version, reason = await served_by(session, gw.url, on_canary)
        assert version == "v1"
        assert reason.endswith("_migrated")
        assert await served_by(session, gw.url, on_baseline) == ("v1", "affinity_hit")


@contextlib.contextmanager
def _redis() -> Iterator[str]:
    if find_redis_server() is None:
        pytest.skip("redis-server not installed")
    with RedisServer() as server:
        yield server.url


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_restarted_gateway_resumes_the_rollout(backend: str) -> None:
    with contextlib.ExitStack() as stack:
        parts: dict[str, Any] = {}
        overrides: dict[str, Any] = {}
        if backend == "memory":
            parts["store"] = MemoryStore()  # the same object outlives the first gateway
        else:
            overrides["store"] = {"url": stack.enter_context(_redis())}
        async with versioned_fleet() as fleet, aiohttp.ClientSession() as session:
            config = fleet.config(**overrides)
            body = spec(min_step_duration_s=0.4)
            async with running_gateway(config, **parts) as first, Traffic(first.url).running():
                assert (await admin(session, "POST", first.url + "/admin/rollouts", body))[0] == 201

                async def second_step() -> bool:
                    return (await rollout_state(session, first.url, ROLLOUT))["step"] >= 2

                await wait_until(second_step, message="rollout at step 2")
                before = await rollout_state(session, first.url, ROLLOUT)
            assert before["state"] == "progressing"

            async with running_gateway(config, **parts) as second:
                resumed = await rollout_state(session, second.url, ROLLOUT)
                # Traffic stopped with the first gateway: the step may have gone
                # "inconclusive" (paused) since; it resumes on its own with traffic.
                assert resumed["state"] in ("progressing", "paused")
                assert resumed["pause_reason"] in (None, "inconclusive")
                assert resumed["step"] >= before["step"]
                assert resumed["step_started_at"] == before["step_started_at"] or (
                    resumed["step"] > before["step"]
                )
                # The new process routes by the stored weights before any evaluation.
                versions = second.gateway.control.versions.get("demo")
                assert versions is not None
                assert versions.weights.share("v2") * 100 == resumed["weights"]["v2"]
                async with Traffic(second.url).running():
                    done = await wait_state(session, second.url, ROLLOUT, "promoted", "rolled_back")
                # On failure, say which gate rolled it back (the message names it).
                assert done["state"] == "promoted", (done["message"], done)
                assert done["leader"] is True
