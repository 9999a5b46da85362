"""Writes nobody waits for cost no round trip each: holder writes are coalesced, touches
throttled to one per session per interval."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from kvgate.core.decision import Affinity
from kvgate.store import RedisStore
from kvgate.store.batching import HolderWrites
from kvgate.testing import wait_until

from .harness import FakeClock


class CountingRedis(Redis):
    """A real client that counts the pipelines it opens (one per round trip here)."""

    pipelines = 0

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        CountingRedis.pipelines += 1
        return super().pipeline(*args, **kwargs)


async def test_writes_of_concurrent_requests_share_a_round_trip(redis_url: str) -> None:
    client = CountingRedis.from_url(redis_url)
    store = RedisStore(redis_url, client=client)
    failures: list[str] = []
    try:
        CountingRedis.pipelines = 0
        for i in range(100):  # 100 requests placed in one turn of the loop
            store.set_holders_soon([(i, f"w{i % 4}"), (1000 + i, "w0")], 60.0, failures.clear)
        # Readable here at once; in Redis after the flush.
        assert await store.local.get_holders([5]) == ["w1"]
        await wait_until(
            lambda: not store._holder_writes._pending and store._holder_writes._task is None,
            message="flushed",
        )
        assert CountingRedis.pipelines <= 2, CountingRedis.pipelines  # was 100: one each
        other = RedisStore(redis_url)
        try:
            assert await other.get_holders([0, 5, 99, 1099]) == ["w0", "w1", "w3", "w0"]
        finally:
            await other.close()
    finally:
        await store.close()


async def test_the_last_write_of_a_block_wins_and_a_failure_is_reported() -> None:
    written: list[dict[int, tuple[str, int]]] = []
    gate, started = asyncio.Event(), asyncio.Event()

    async def write(batch: dict[int, tuple[str, int]]) -> None:
        started.set()
        await gate.wait()
        written.append(dict(batch))
        if len(written) == 2:
            raise ConnectionError("down")

    writes = HolderWrites(write)
    failed: list[int] = []
    writes.add([(1, "a")], 10, lambda: failed.append(1))
    await started.wait()  # the first flush took block 1 and waits on the gate
    writes.add([(2, "a")], 10, lambda: failed.append(2))
    writes.add([(2, "b"), (3, "b")], 10, lambda: failed.append(2))
    gate.set()
    await wait_until(lambda: len(written) == 2, message="two flushes")
    assert written == [{1: ("a", 10, "")}, {2: ("b", 10, ""), 3: ("b", 10, "")}]
    assert writes.flushes == 2
    assert failed == [2, 2]  # the second batch's callbacks (each distinct one), once
    await writes.close()


@pytest.mark.parametrize("count", [1, 3])
async def test_close_drops_what_is_pending(count: int) -> None:
    never = asyncio.Event()

    async def write(batch: dict[int, tuple[str, int]]) -> None:
        await never.wait()

    writes = HolderWrites(write)
    for i in range(count):
        writes.add([(i, "w")], 10, lambda: None)
    await asyncio.sleep(0)
    await writes.close()
    assert writes._task is None and not writes._pending


async def test_a_session_is_touched_in_redis_once_per_interval(redis_url: str) -> None:
    clock = FakeClock(start=0.0)
    store = RedisStore(redis_url, touch_interval_s=5.0, clock=clock, epoch_check_s=3600.0)
    other = RedisStore(redis_url)
    try:
        await store.set(Affinity("s", "w0", "v1", 0.0), 60.0)
        assert await store.touch("s", 0.0, 60.0)  # goes out (and loads the script)
        async with Redis.from_url(redis_url) as raw:
            await raw.config_resetstat()
            for second in range(1, 10):  # a request a second
                clock.now = float(second)
                assert await store.touch("s", float(second), 60.0)
            stats = await raw.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 1  # at 5 s only: was one per request
        assert (await store.local.get("s")) == Affinity("s", "w0", "v1", 9.0)  # kept time here
        assert (await other.get("s")) == Affinity("s", "w0", "v1", 5.0)
        await other.delete("s")  # gone elsewhere: the next touch that goes out says so
        clock.now = 10.0
        assert not await store.touch("s", 10.0, 60.0)
    finally:
        await store.close()
        await other.close()
