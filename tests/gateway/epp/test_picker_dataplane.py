"""The data plane's behaviours hold with Envoy moving the bytes and the picker deciding:
shedding (in test_extproc), the canary split and stickiness, rollback on errors, outlier
ejection, and replicas that are active-active over a shared Redis store."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest

from kvgate.gateway.epp import Picker
from kvgate.testing import wait_until
from kvgate.testing_redis import RedisServer

from ..conftest import gateway_config, worker_fleet
from ..rollout_fleet import admin, spec, versioned_fleet, wait_state
from .conftest import chat, envoy, leases_released, running_picker
from .envoy import EnvoyLike

pytestmark = pytest.mark.asyncio


async def test_the_canary_split_is_a_pick_among_its_versions_endpoints_and_sessions_stick() -> None:
    async with versioned_fleet(baseline=2, canary=2) as fleet:
        config = fleet.config(models={"demo": {"weights": {"v1": 75, "v2": 25}, "stable": "v1"}})
        async with running_picker(config) as picker, envoy(picker) as client:
            canary = {w.url.removeprefix("http://") for w in fleet.canary}
            versions: Counter[str] = Counter()
            first: dict[str, str] = {}
            for n in range(160):
                session = {"x-session-id": f"s{n}"}
                result = await client.request(chat(f"turn one of {n}"), headers=session)
                version = result.headers["x-kvgate-model-version"]
                versions[version] += 1
                # the fallbacks are of the picked version (the split holds on a retry), but
                # for the last of a canary's pick: the stable version's, as the proxy retries
                same = result.endpoints[:-1] if version == "v2" else result.endpoints
                assert all((e in canary) == (version == "v2") for e in same)
                if version == "v2":
                    assert result.endpoints[-1] not in canary
                first[session["x-session-id"]] = result.served or ""
            for session_id, served in first.items():
                again = await client.request(chat("turn two"), headers={"x-session-id": session_id})
                assert again.served == served, session_id  # stickiness
            await wait_until(lambda: leases_released(picker), message="released")
        share = versions["v2"] / sum(versions.values())
        assert 0.15 <= share <= 0.35, versions


@contextlib.asynccontextmanager
async def envoy_traffic(client: EnvoyLike, concurrency: int = 4) -> AsyncIterator[Counter[int]]:
    """Closed-loop requests with distinct prompts through ``client`` for the block."""
    statuses: Counter[int] = Counter()
    stop = asyncio.Event()

    async def loop(worker: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            result = await client.request(chat(f"request {worker}-{n}"))
            statuses[result.status] += 1

    tasks = [asyncio.create_task(loop(i)) for i in range(concurrency)]
    try:
        yield statuses
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_a_failing_canary_rolls_back_through_the_picker() -> None:
    async with versioned_fleet(canary=1, error_rate=0.3) as fleet:
        config = fleet.config(epp={"fallbacks": 0})
        async with (
            running_picker(config) as picker,
            envoy(picker, "buffered") as client,
            aiohttp.ClientSession() as session,
            envoy_traffic(client) as statuses,
        ):
            base = f"http://127.0.0.1:{picker.http_port}"
            body = spec(steps=[25, 50, 100], gates={"min_samples": 10, "max_error_rate": 0.01})
            status, answer = await admin(session, "POST", base + "/admin/rollouts", body)
            assert status == 201, answer
            done = await wait_state(session, base, "demo/v2", "rolled_back", "promoted")
        assert done["state"] == "rolled_back", done
        assert done["weights"]["v2"] == 0.0
        assert statuses[500] > 0  # the canary's errors reached the client (no proxy retry here)
        assert client.protocol_errors == 0
        await wait_until(lambda: leases_released(picker), message="released")


async def test_a_failing_worker_is_ejected_and_then_not_picked() -> None:
    async with worker_fleet(1) as good, worker_fleet(1, error_rate=1.0) as bad:
        config = gateway_config(
            [*good, *bad], outlier={"consecutive_failures": 3, "base_ejection_s": 60.0}
        )
        async with running_picker(config) as picker, envoy(picker) as client:
            failing = picker.gateway.pool.get(bad[0].url)
            assert failing is not None
            n = 0
            while not failing.ejected:
                n += 1
                assert n < 200, "never ejected"
                result = await client.request(chat(f"eject {n}"))
                assert result.status == 200  # the fallback served what the failing one did not
            bad_endpoint = bad[0].url.removeprefix("http://")
            for m in range(20):
                result = await client.request(chat(f"after {m}"))
                assert bad_endpoint not in result.endpoints
            await wait_until(lambda: leases_released(picker), message="released")


async def test_replicas_are_active_active_over_a_shared_redis_store() -> None:
    try:
        redis = RedisServer().start()
    except FileNotFoundError:
        pytest.skip("redis-server not installed")
    try:
        async with worker_fleet(3) as fleet:
            config = gateway_config(fleet, store={"url": redis.url})
            async with running_picker(config) as one, running_picker(config) as two:
                pickers: list[Picker] = [one, two]
                async with envoy(one) as first, envoy(two) as second:
                    clients = [first, second]
                    for n in range(12):
                        session = {"x-session-id": f"user-{n}"}
                        bound = await first.request(chat(f"hello {n}"), headers=session)
                        # Every later turn, through either replica, goes where the first did.
                        for turn in range(4):
                            client = clients[turn % 2]
                            again = await client.request(chat(f"turn {turn}"), headers=session)
                            assert again.served == bound.served
                for picker in pickers:
                    await wait_until(lambda p=picker: leases_released(p), message="released")
                    assert picker.gateway.ready()
    finally:
        redis.close()


async def test_a_canary_pick_falls_back_to_the_stable_version_and_the_canary_is_charged() -> None:
    async with versioned_fleet(canary=1, error_rate=1.0) as fleet:
        config = fleet.config(models={"demo": {"weights": {"v1": 50, "v2": 50}, "stable": "v1"}})
        async with running_picker(config) as picker, envoy(picker) as client:
            stable = fleet.baseline[0].url.removeprefix("http://")
            canary = fleet.canary[0].url.removeprefix("http://")
            picked_canary = 0
            for n in range(30):
                result = await client.request(chat(f"split {n}"))
                assert result.status == 200  # the stable fallback served what the canary failed
                if result.endpoints[0] == canary:
                    picked_canary += 1
                    assert result.endpoints == [canary, stable]
                    assert result.served == stable
                    assert result.headers["x-kvgate-model-version"] == "v1"
            await wait_until(lambda: leases_released(picker), message="released")
            attempts = picker.gateway.metrics.rollout.attempts
            errors = attempts.labels("demo", "v2", "error")._value.get()
        assert picked_canary > 5
        assert errors == picked_canary  # every failed canary attempt counts against v2
