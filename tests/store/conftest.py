"""Fixtures for the store tests: one shared redis-server, and stores of each backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from kvgate.store import MemoryStore, RedisStore
from kvgate.testing_redis import RedisClusterServers, RedisServer, find_redis_server

from .harness import FakeClock, StoreUnderTest


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the whole session (tests flush it before use)."""
    if find_redis_server() is None:
        pytest.skip("redis-server not installed")
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The shared server's URL, emptied for this test."""
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    return redis_server.url


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock for memory stores."""
    return FakeClock()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """One Redis Cluster (3 masters, 3 replicas) on loopback for the whole session."""
    if find_redis_server() is None:
        pytest.skip("redis-server not installed")
    with RedisClusterServers() as cluster:
        yield cluster


@pytest.fixture
def cluster_url(redis_cluster: RedisClusterServers) -> str:
    """The cluster's URL, every master emptied for this test."""
    for node in redis_cluster.nodes:
        if node.running and redis_cluster.info(node, "role").startswith("master"):
            redis_cluster.info(node, "flushall")
    return redis_cluster.url


@pytest.fixture(params=["memory", "redis", "cluster"])
async def sut(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[StoreUnderTest]:
    """The store under test, once per backend."""
    if request.param == "memory":
        under_test = StoreUnderTest("memory", MemoryStore(clock=clock), clock)
    elif request.param == "cluster":
        url = request.getfixturevalue("cluster_url")
        under_test = StoreUnderTest(
            "redis", RedisStore(url, socket_timeout=1.0, connect_timeout=2.0), None
        )
    else:
        url = request.getfixturevalue("redis_url")
        under_test = StoreUnderTest(
            "redis", RedisStore(url, socket_timeout=1.0, connect_timeout=2.0), None
        )
    yield under_test
    if request.param == "cluster":  # answered by the cluster, not by the local fallback
        assert under_test.store.errors_total == 0
    await under_test.store.close()
