"""Workers added through the admin API are saved in the store and come back after a restart."""

from __future__ import annotations

import aiohttp

from kvgate.gateway.testing import running_gateway
from kvgate.store import MemoryStore
from kvgate.workersim.runner import WorkerHandle

from .conftest import gateway_config


async def test_admin_added_workers_survive_a_restart(workers: list[WorkerHandle]) -> None:
    store = MemoryStore()  # outlives the gateways, as Redis would
    config = gateway_config(workers[:1])
    async with (
        running_gateway(config, store=store) as gw,
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/admin/workers", json={"url": workers[1].url}) as resp,
    ):
        assert resp.status == 201
    async with running_gateway(config, store=store) as gw:
        assert sorted(w.id for w in gw.gateway.pool) == sorted(w.url for w in workers)
        async with (
            aiohttp.ClientSession() as session,
            session.delete(gw.url + "/admin/workers", params={"url": workers[1].url}) as resp,
        ):
            assert resp.status == 200
    async with running_gateway(config, store=store) as gw:
        assert [w.id for w in gw.gateway.pool] == [workers[0].url]
