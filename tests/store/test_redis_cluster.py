"""The store on a real Redis Cluster: keys spread over every master, failover under traffic."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from redis.crc import key_slot

from kvgate.core.decision import Affinity
from kvgate.gateway.testing import running_gateway
from kvgate.store import RedisStore
from kvgate.store.cluster import cluster_nodes, cluster_prefix, shard_prefixes
from kvgate.testing import wait_until, wait_until_sync
from kvgate.testing_redis import RedisClusterServers, find_redis_server
from kvgate.workersim import WorkerOptions, running_worker

pytestmark = pytest.mark.skipif(find_redis_server() is None, reason="redis-server not installed")


def test_cluster_urls_name_every_startup_node() -> None:
    args = cluster_nodes("rediss+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2:7001")
    assert [(n.host, n.port) for n in args["startup_nodes"]] == [
        ("10.0.0.1", 7000),
        ("10.0.0.2", 7001),
    ]
    assert (args["username"], args["password"], args["ssl"]) == ("u", "p@ss", True)


def test_cluster_prefixes_carry_one_hash_tag() -> None:
    assert cluster_prefix("kvgate:") == "{kvgate}:"
    assert cluster_prefix("team-a:") == "{team-a}:"
    assert cluster_prefix("x:{aff}:") == "x:{aff}:"


def test_shard_tags_fall_in_evenly_spaced_slots() -> None:
    prefixes = shard_prefixes("{kvgate}:", 16)
    assert prefixes == shard_prefixes("kvgate:", 16)  # every replica computes the same
    slots = [key_slot(p.encode()) for p in prefixes]
    assert [slot * 16 // 16384 for slot in slots] == list(range(16))


async def test_keys_land_on_every_master_and_scripts_stay_on_one_slot(
    redis_cluster: RedisClusterServers, cluster_url: str
) -> None:
    store = RedisStore(cluster_url, socket_timeout=1.0, connect_timeout=1.0)
    try:
        for i in range(300):
            bound = Affinity(f"user-{i}", f"w{i % 4}", "v1", float(i))
            assert await store.compare_and_set(bound.session_key, None, bound, 60) == bound
        await store.set_holders([(i * 7919, f"w{i % 4}") for i in range(300)], 60)
        assert not store.degraded and store.errors_total == 0  # no CROSSSLOT anywhere
        assert await store.counts() == {f"w{n}": 75 for n in range(4)}
        oldest = await store.sessions_of("w1", limit=3)
        assert [a.session_key for a in oldest] == ["user-1", "user-5", "user-9"]
        assert (await store.get_holders([0, 7919]))[1] == "w1"
        masters = [
            node
            for node in redis_cluster.nodes
            if node.running and redis_cluster.info(node, "role").startswith("master")
        ]
        keys = [int(redis_cluster.info(node, "dbsize").strip()) for node in masters]
        assert len(keys) == 3 and all(k > 0.15 * sum(keys) for k in keys), keys
    finally:
        await store.close()


async def test_a_master_fails_over_under_traffic_without_a_lost_request() -> None:
    # Its own cluster: killing a master must not disturb the other tests' one.
    with RedisClusterServers(node_timeout_ms=1000) as cluster:
        store = RedisStore(cluster.url, socket_timeout=0.5, connect_timeout=0.5)
        async with (
            running_worker(WorkerOptions(port=0, seed=0, profile="fast", time_scale=50.0)) as w0,
            running_worker(WorkerOptions(port=0, seed=1, profile="fast", time_scale=50.0)) as w1,
        ):
            config = {
                "workers": [{"url": w0.url}, {"url": w1.url}],
                "health": {"interval_s": 0.1, "timeout_s": 2.0},
                "store": {"url": cluster.url},
            }
            async with (
                running_gateway(config, store=store) as gw,
                aiohttp.ClientSession() as session,
            ):
                await wait_until(lambda: all(w.probe_ok for w in gw.gateway.pool), message="up")
                statuses: list[int] = []
                stop = asyncio.Event()

                async def client(n: int) -> None:
                    turn = 0
                    while not stop.is_set():
                        body = {
                            "model": "demo",
                            "messages": [{"role": "user", "content": f"turn {turn}"}],
                            "max_tokens": 2,
                        }
                        headers = {"X-Session-ID": f"s{n}"}
                        async with session.post(
                            gw.openai_base + "/chat/completions", json=body, headers=headers
                        ) as resp:
                            await resp.read()
                            statuses.append(resp.status)
                        turn += 1

                clients = [asyncio.create_task(client(n)) for n in range(4)]
                await wait_until(lambda: len(statuses) >= 20, message="traffic before")
                master = cluster.master_of(f"{store.prefix}workers")
                master.stop()  # the master of the store's slot dies
                errors = store.errors_total
                await wait_until(lambda: store.errors_total > errors, message="store notices")
                await asyncio.to_thread(
                    wait_until_sync, cluster.healthy, 30, 0.2, "replica promoted"
                )
                await wait_until(store.try_recover, timeout=30, message="store recovers")
                before = len(statuses)
                await wait_until(lambda: len(statuses) >= before + 20, message="traffic after")
                stop.set()
                await asyncio.gather(*clients)
            assert set(statuses) == {200}, statuses  # not one request lost
            # The store ends healthy. A call after the promotion can still reach the dead
            # master twice (a node the client refreshes its slot map from may not have
            # heard of the promotion yet) and degrade the store again, as it should; it
            # must then recover, not stay degraded.
            await wait_until(store.try_recover, timeout=30, message="healthy after")
            assert not store.degraded
            # Writes land in the cluster again: a second client sees them. The write may
            # itself be the call that still reaches the dead master (its shard's slot map
            # not yet refreshed): then it is kept locally and pushed on recovery.
            await store.set(Affinity("after", w0.url, "default", 1.0), 60)
            await wait_until(store.try_recover, timeout=30, message="the write pushed")
            other = RedisStore(cluster.url, socket_timeout=1.0, connect_timeout=1.0)
            try:
                found = await other.get("after")
                assert found is not None and found.worker == w0.url
                assert (await other.get("s0")) is not None  # a session bound during the run
            finally:
                await other.close()
        await store.close()
