"""A store that lost its data (FLUSHALL, a restart without persistence) is seen and counted."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from redis.asyncio import Redis

from kvgate.core.decision import Affinity
from kvgate.gateway.testing import running_gateway
from kvgate.store import RedisStore
from kvgate.store.epoch import Epoch
from kvgate.testing import wait_until
from kvgate.testing_redis import RedisServer
from kvgate.workersim import WorkerOptions, running_worker


def test_the_first_check_learns_later_ones_compare() -> None:
    a, b = Epoch("a"), Epoch("b")
    assert not a.observe(None)  # a seeds the epoch "a"
    assert not b.observe("a")  # b learns it
    assert not a.observe("a") and not b.observe("a")
    # FLUSHALL: b checks first and seeds its token; a then sees b's.
    seeded = b.token
    assert b.observe(None)
    assert a.observe(seeded)
    assert not a.observe(seeded) and not b.observe(seeded)  # once per event
    # A second loss, found by the same replica that seeded the last epoch.
    assert b.observe(None)
    assert a.observe(b.known)


async def test_a_flushall_is_logged_once_and_counted_by_every_replica(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    stores = [RedisStore(redis_url, epoch_check_s=0.02) for _ in range(2)]
    try:
        for n, store in enumerate(stores):
            await store.set(Affinity(f"s{n}", "w0", "v1", 0.0), 60.0)
            await store.check_epoch()
        with caplog.at_level(logging.WARNING, logger="kvgate.store.redis_store"):
            async with Redis.from_url(redis_url) as client:
                await client.flushall()
            await wait_until(
                lambda: all(s.health().data_lost_total == 1 for s in stores),
                message="both replicas saw the loss",
            )
            for store in stores:  # later checks find the new epoch: no second event
                await store.check_epoch()
        lost = [r for r in caplog.records if "lost its data" in r.getMessage()]
        assert len(lost) == 2  # one line per replica for the one event
        assert [s.health().data_lost_total for s in stores] == [1, 1]
        assert await stores[0].get("s0") is None
    finally:
        for store in stores:
            await store.close()


async def test_a_restart_without_persistence_shows_in_the_gateway_metrics() -> None:
    with RedisServer() as redis:
        async with running_worker(WorkerOptions(port=0, seed=0, profile="fast")) as worker:
            store = RedisStore(redis.url, epoch_check_s=0.02, socket_timeout=0.5)
            config = {
                "workers": [{"url": worker.url}],
                "health": {"interval_s": 0.1, "timeout_s": 2.0},
                "store": {"url": redis.url},
            }
            async with running_gateway(config, store=store) as gw, aiohttp.ClientSession() as http:

                async def lost() -> str:
                    async with http.get(gw.url + "/metrics") as resp:
                        text = await resp.text()
                    return next(
                        line for line in text.splitlines()
                        if line.startswith("kvgate_store_data_lost_total")
                    )  # fmt: skip

                await wait_until(lambda: store._epoch.known is not None, message="epoch")
                assert await lost() == "kvgate_store_data_lost_total 0.0"
                redis.stop()
                redis.start()
                await wait_until(
                    lambda: store.health().data_lost_total == 1, timeout=15, message="seen"
                )
                assert await lost() == "kvgate_store_data_lost_total 1.0"
