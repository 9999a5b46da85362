"""Draining a worker by hand through the admin API."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import aiohttp

from kvgate.core.decision import Affinity
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.store import MemoryStore
from kvgate.testing import wait_until

from .conftest import every_worker_up, gateway_config, set_faults, worker_fleet
from .pressure_fleet import chat

TOKEN = {"Authorization": "Bearer s3cret"}


async def admin(
    session: aiohttp.ClientSession, gw: GatewayHandle, path: str, method: str = "POST", **kw: Any
) -> tuple[int, Any]:
    async with session.request(method, gw.url + path, **kw) as resp:
        return resp.status, await resp.json()


async def test_a_drained_worker_takes_no_new_sessions_and_its_sessions_move_on_arrival() -> None:
    store = MemoryStore()
    async with (
        worker_fleet(2) as (a, b),
        running_gateway(gateway_config([a, b], admin_token="s3cret"), store=store) as gw,
        aiohttp.ClientSession() as session,
    ):
        await wait_until(gw.gateway.ready, message="gateway ready")
        await every_worker_up(gw)
        await store.set(Affinity("s1", a.url, "v1"), 60.0)
        assert await chat(session, gw, "s1") == (200, a.url, "affinity_hit")

        assert (await admin(session, gw, f"/admin/workers/{quote(a.url, safe='')}/drain"))[0] == 401
        status, body = await admin(
            session, gw, f"/admin/workers/{quote(a.url, safe='')}/drain", headers=TOKEN
        )
        assert status == 200
        assert body["draining"] and body["drained_by_admin"] and body["changed"]

        new = [await chat(session, gw, f"new-{i}") for i in range(4)]
        assert {(s, w) for s, w, _ in new} == {(200, b.url)}
        assert await chat(session, gw, "s1") == (200, b.url, "affinity_lost_migrated")
        bound = await store.get("s1")
        assert bound is not None and bound.worker == b.url

        # By host:port this time; draining twice changes nothing.
        ref = a.url.split("://")[1]
        status, body = await admin(session, gw, f"/admin/workers/{ref}/drain", headers=TOKEN)
        assert status == 200 and not body["changed"]
        status, body = await admin(session, gw, f"/admin/workers/{ref}/undrain", headers=TOKEN)
        assert status == 200 and not body["draining"] and body["changed"]
        status, report = await admin(session, gw, "/admin/pressure", "GET", headers=TOKEN)
        assert status == 200
        assert {w["worker"]: w["draining"] for w in report["workers"]} == {
            a.url: False,
            b.url: False,
        }
        metrics = gw.gateway.metrics.render().decode()
    assert f'kvgate_worker_drains_total{{cause="admin",worker="{a.url}"}} 1.0' in metrics


async def test_draining_lets_requests_in_flight_finish() -> None:
    async with (
        worker_fleet(2) as (a, b),
        running_gateway(gateway_config([a, b], admin_token="s3cret")) as gw,
        aiohttp.ClientSession() as session,
    ):
        await wait_until(gw.gateway.ready, message="gateway ready")
        await set_faults(a, extra_latency_ms=300)
        await set_faults(b, extra_latency_ms=300)
        slow = asyncio.create_task(chat(session, gw, "s1"))
        await wait_until(lambda: gw.gateway.pool.in_flight() == 1, message="one in flight")
        busy = next(w for w in gw.gateway.pool if w.in_flight == 1)
        index = [w.id for w in gw.gateway.pool].index(busy.id)
        status, body = await admin(session, gw, f"/admin/workers/{index}/drain", headers=TOKEN)
        assert status == 200 and body["worker"] == busy.id and body["in_flight"] == 1
        # The request already on the drained worker finishes there.
        assert (await slow)[:2] == (200, busy.id)
        assert busy.draining


async def test_unknown_worker_is_404() -> None:
    async with (
        worker_fleet(1) as fleet,
        running_gateway(gateway_config(fleet, admin_token="s3cret")) as gw,
        aiohttp.ClientSession() as session,
    ):
        status, body = await admin(session, gw, "/admin/workers/nope:1/drain", headers=TOKEN)
    assert status == 404
    assert body["error"]["code"] == "not_found"
