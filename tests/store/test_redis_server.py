"""The throwaway redis-server helper other tests rely on."""

from __future__ import annotations

import pytest
import redis

from kvgate.testing_redis import RedisServer, find_redis_server

pytestmark = pytest.mark.skipif(find_redis_server() is None, reason="redis-server not installed")


def test_restarts_empty_on_the_same_port() -> None:
    with RedisServer() as server:
        port = server.port
        with redis.Redis.from_url(server.url) as client:
            client.set("k", "v")
            assert client.config_get("save") == {"save": ""}
        server.stop()
        assert not server.running
        server.start()
        assert server.port == port and server.running
        with redis.Redis.from_url(server.url) as client:
            assert client.get("k") is None
    assert not server.running
