"""The dashboard's routes and state, without a browser (the browser test is beside it)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from kvgate.core.gates import EARLY_FAIL_MIN_ERRORS
from kvgate.core.pressure import PressureConfig
from kvgate.gateway.admin.dashboard import _asset, hot_because
from kvgate.gateway.observe.metrics import WorkerGaugeRow
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import wait_until
from kvgate.workersim.runner import WorkerHandle

from .conftest import every_worker_up, gateway_config, worker_fleet
from .rollout_fleet import TOKEN, Traffic, admin, spec, versioned_fleet, wait_state

CALM = WorkerGaugeRow(
    worker="w",
    model="m",
    version="v1",
    in_flight=1,
    health="healthy",
    ejected=False,
    max_in_flight=4,
    kv_usage=0.2,
    gpu_temp_c=50.0,
    running=1,
    waiting=0,
    scrape_age_s=0.1,
    signals_fresh=True,
)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, []),
        ({"kv_usage": 0.9}, ["KV 90% ≥ soft 85%"]),
        ({"kv_usage": 0.97, "pressure": "hard"}, ["pressure hard", "KV 97% ≥ hard 95%"]),
        ({"gpu_temp_c": 86.0}, ["GPU 86°C ≥ 83°C"]),
        ({"in_flight": 4, "waiting": 3}, ["full: 4/4 in flight", "3 waiting"]),
        ({"signals_fresh": False}, ["signals stale"]),
        ({"signals_fresh": False, "scrape_age_s": None}, ["never scraped"]),
        ({"health": "ejected", "signals_fresh": False}, ["ejected"]),
    ],
)
def test_why_a_worker_is_hot_uses_routings_thresholds(
    changes: dict[str, Any], expected: list[str]
) -> None:
    assert hot_because(replace(CALM, **changes), PressureConfig()) == expected


def test_the_page_fetches_nothing_from_the_internet() -> None:
    for name in ("dashboard.html", "dashboard.js", "dashboard.css"):
        text = _asset(name).decode()
        # Only the gateway's own paths: no CDN, no web font, no external script.
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), name
        assert "@import" not in text and "url(http" not in text, name
    html = _asset("dashboard.html").decode()
    assert '<script src="/dashboard/static/dashboard.js">' in html


async def get(gw: GatewayHandle, path: str, token: str | None = None) -> tuple[int, Any, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(gw.url + path, headers=headers, allow_redirects=False) as resp,
    ):
        text = await resp.text()
        kind = resp.headers.get("Content-Type", "")
        body = await resp.json() if kind.startswith("application/json") else None
        return resp.status, body if body is not None else text, resp.headers.get("Location", "")


async def test_root_redirects_and_assets_are_served(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        status, _, location = await get(gw, "/")
        assert (status, location) == (302, "/dashboard")
        status, page, _ = await get(gw, "/dashboard")
        assert status == 200 and "<title>kvgate" in page
        for name in ("dashboard.js", "dashboard.css"):
            status, _, _ = await get(gw, f"/dashboard/static/{name}")
            assert status == 200, name
        status, body, _ = await get(gw, "/dashboard/static/../app.py")
        assert status == 404
        status, body, _ = await get(gw, "/dashboard/static/secret.py")
        assert status == 404 and body["error"]["code"]


async def test_state_needs_the_admin_token_when_one_is_set(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers, admin_token="t0k")) as gw:
        status, body, _ = await get(gw, "/dashboard/state.json")
        assert status == 401
        assert body["error"]["type"] and body["error"]["code"] == "invalid_admin_token"
        status, body, _ = await get(gw, "/dashboard/state.json", token="wrong")
        assert status == 401
        status, body, _ = await get(gw, "/dashboard/state.json", token="t0k")
        assert status == 200 and len(body["workers"]) == 2


async def test_the_dashboard_is_mounted_with_the_admin_api_or_not_at_all(
    workers: list[WorkerHandle],
) -> None:
    """One mount: with the admin API disabled, neither the page nor its state exists
    (the state is the admin API's data, behind its guard)."""
    config = gateway_config(workers, admin={"enabled": False})
    async with running_gateway(config) as gw:
        for path in ("/", "/dashboard", "/dashboard/static/dashboard.js", "/dashboard/state.json"):
            status, body, _ = await get(gw, path)
            assert status == 404, path
            assert body["error"]["code"] == "not_found", path


async def test_the_state_has_the_admin_apis_guard(workers: list[WorkerHandle]) -> None:
    """The same guard as every admin route: the same token, the same refusal."""
    async with running_gateway(gateway_config(workers, admin_token="t0k")) as gw:
        for path in ("/dashboard/state.json", "/admin/workers"):
            status, body, _ = await get(gw, path, token="wrong")
            assert (status, body["error"]["message"]) == (
                401,
                "the admin API needs 'Authorization: Bearer <admin_token>'",
            ), path


async def test_state_counts_sheds_and_where_traffic_went() -> None:
    async with worker_fleet(1, extra_latency_ms=300) as fleet:
        config = gateway_config(
            fleet,
            workers=[{"url": fleet[0].url, "max_in_flight": 1}],
            admission={"max_wait_standard_s": 0},
        )
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await every_worker_up(gw)
            url = gw.openai_base + "/completions"
            body = {"model": "demo", "prompt": "hello", "max_tokens": 2}

            async def post() -> int:
                async with session.post(url, json=body) as resp:
                    await resp.read()
                    return resp.status

            first = asyncio.create_task(post())
            await wait_until(lambda: gw.gateway.pool.in_flight() == 1, message="one in flight")
            assert await post() == 429
            assert await first == 200
            status, state, _ = await get(gw, "/dashboard/state.json")
    assert status == 200
    minute = state["traffic"]["last_minute"]
    assert minute["requests"] == 2 and minute["sheds"] == {"saturated": 1}
    assert minute["workers"] == {fleet[0].url: 1}
    assert state["totals"]["sheds"] == [{"labels": ["saturated", "standard"], "value": 1.0}]
    (worker,) = state["workers"]
    assert worker["id"] == fleet[0].url and worker["health"] == "healthy"
    assert worker["max_in_flight"] == 1 and worker["gpu_temp_c"] is not None
    assert state["totals"]["requests"] == 2


async def test_a_rolled_back_rollout_shows_the_gate_that_stopped_it() -> None:
    async with (
        versioned_fleet(canary=1, error_rate=0.5) as fleet,
        running_gateway(fleet.config()) as gw,
        aiohttp.ClientSession() as session,
        Traffic(gw.url).running(),
    ):
        body = spec(steps=[25, 50, 100], gates={"min_samples": 10, "max_error_rate": 0.01})
        status, created = await admin(session, "POST", gw.url + "/admin/rollouts", body)
        assert status == 201, created
        await wait_state(session, gw.url, created["rollout"], "rolled_back", within=20)
        status, state, _ = await get(gw, "/dashboard/state.json", token=TOKEN)
    assert status == 200
    (rollout,) = state["rollouts"]
    assert rollout["state"] == "rolled_back"
    failed = [g for g in rollout["gates"] if g["verdict"] == "fail"]
    assert [g["name"] for g in failed] == ["error_rate"]
    # The error gate may fail before min_samples once the errors prove the bound broken
    # (issue 13): at least EARLY_FAIL_MIN_ERRORS errors, so at least that many samples.
    assert failed[0]["observed"] > failed[0]["bound"] == 0.01
    assert failed[0]["samples"] >= EARLY_FAIL_MIN_ERRORS
    reasons = [h["reason"] for h in rollout["history"]]
    assert reasons[0] == "started" and reasons[-1] == "rolled_back"
    assert rollout["history"][-1]["failed"] == ["error_rate"]
    assert len(reasons) == len(set(reasons))  # repeats are kept once
