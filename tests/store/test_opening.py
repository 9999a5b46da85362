"""open_store picks a backend from a URL and rejects what it does not know."""

from __future__ import annotations

import pytest

from kvgate.store import MemoryStore, RedisStore, open_store

from .harness import FakeClock


async def test_memory_with_options() -> None:
    clock = FakeClock()
    store = open_store("memory", max_sessions=10, clock=clock)
    assert isinstance(store, MemoryStore)
    assert store.table.max_sessions == 10
    assert store.clock is clock


async def test_redis_url_with_options() -> None:
    store = open_store("redis://127.0.0.1:1/3", prefix="fleet-a:", socket_timeout=0.05)
    assert isinstance(store, RedisStore)
    assert store.prefix == "fleet-a:"
    assert store.url == "redis://127.0.0.1:1/3"
    await store.close()


def test_unknown_url_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="unknown store URL"):
        open_store("etcd://somewhere")


def test_option_for_the_other_backend_is_rejected() -> None:
    with pytest.raises(TypeError):
        open_store("memory", prefix="x:")
