"""Lookups served from a read cache that Redis's invalidations keep true."""

from __future__ import annotations

from redis.asyncio import Redis

from kvgate.core.decision import Affinity
from kvgate.store import RedisStore
from kvgate.testing import wait_until
from kvgate.testing_redis import RedisServer


def bound(key: str, worker: str, t: float = 0.0) -> Affinity:
    return Affinity(key, worker, "v1", t)


async def _evalsha_calls(raw: Redis) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_a_lookup_is_read_once_until_another_replica_changes_it(redis_url: str) -> None:
    mine, other = RedisStore(redis_url), RedisStore(redis_url, read_cache=False)
    try:
        await other.set(bound("s", "w0"), 60.0)
        assert await mine.get("s") == bound("s", "w0")  # starts the listener
        assert mine._cache is not None
        await wait_until(lambda: mine._cache is not None and mine._cache.live, message="live")
        assert await mine.get("s") == bound("s", "w0")  # read and cached
        async with Redis.from_url(redis_url) as raw:
            before = await _evalsha_calls(raw)
            for _ in range(20):
                assert await mine.get("s") == bound("s", "w0")
            assert await _evalsha_calls(raw) == before  # no round trip
            # Another replica moves the session: the next lookup here sees it.
            assert await other.compare_and_set("s", "w0", bound("s", "w1"), 60.0) == bound(
                "s", "w1"
            )
            await wait_until(lambda: mine._cache is not None and mine._cache.get("s", 0.0) is None)
            assert await mine.get("s") == bound("s", "w1")
            await other.delete("s")
            await wait_until(lambda: mine._cache is not None and mine._cache.get("s", 0.0) is None)
            assert await mine.get("s") is None
            # A flush empties it too.
            await other.set(bound("t", "w2"), 60.0)
            assert await mine.get("t") == bound("t", "w2")
            await raw.flushall()
            await wait_until(lambda: mine._cache is not None and mine._cache.get("t", 0.0) is None)
            assert await mine.get("t") is None
    finally:
        await mine.close()
        await other.close()


async def test_a_change_during_a_read_is_not_cached(redis_url: str) -> None:
    store = RedisStore(redis_url)
    try:
        await store.set(bound("s", "w0"), 60.0)
        cache = store._cache
        assert cache is not None
        await wait_until(lambda: cache.live, message="live")
        ticket = cache.ticket()
        cache._invalidated([b"kvgate:s:s"])  # heard while the read was in flight
        cache.put(ticket, "s", bound("s", "w0"), 0.0, 1e12)
        assert cache.get("s", 0.0) is None
        cache.put(cache.ticket(), "s", bound("s", "w0"), 0.0, 1e12)
        assert cache.get("s", 0.0) == bound("s", "w0")
        assert cache.get("s", 10.0) is None  # read again after MAX_AGE_S, whatever its TTL
    finally:
        await store.close()


async def test_an_outage_turns_the_cache_off_until_redis_is_back() -> None:
    with RedisServer() as server:
        store = RedisStore(server.url, backoff_initial=60.0, socket_timeout=0.5)
        try:
            await store.set(bound("s", "w0"), 60.0)
            cache = store._cache
            assert cache is not None
            await wait_until(lambda: cache.live, message="live")

            async def cached() -> bool:  # the set's own invalidation may cross a first read
                assert await store.get("s") == bound("s", "w0")
                return cache.get("s", 0.0) == bound("s", "w0")

            await wait_until(cached, message="cached")
            server.stop()
            await wait_until(lambda: not cache.live, message="listener gone")
            assert cache.get("s", 0.0) is None  # nothing served while deaf
            server.start()  # empty: the binding is gone
            await store.get("s")  # may degrade, as any call to a Redis that went away
            await wait_until(store.try_recover, timeout=15, message="recovered")
            await wait_until(lambda: cache.live, message="listening again")
            async with Redis.from_url(server.url) as raw:
                await raw.delete("kvgate:s:s")  # whatever the resync pushed back
            await wait_until(lambda: cache.get("s", 0.0) is None, message="invalidated")
            assert await store.get("s") is None
        finally:
            await store.close()
