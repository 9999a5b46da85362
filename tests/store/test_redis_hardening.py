"""Redis outages as an operator sees them: no secret in the log, no flapping, counted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from kvgate.core.decision import Affinity
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.redaction import RedactingFilter, redact
from kvgate.store import RedisStore
from kvgate.testing import free_port, wait_until
from kvgate.testing_redis import RedisServer, find_redis_server

PATIENT = {"socket_timeout": 1.0, "connect_timeout": 2.0}


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A redis-server of this test's own, to stop and restart."""
    if find_redis_server() is None:
        pytest.skip("redis-server not installed")
    with RedisServer() as server:
        yield server


def test_redact_blanks_credentials_in_any_url() -> None:
    assert redact("redis://:s3cret@10.0.0.1:6379/0") == "redis://***@10.0.0.1:6379/0"
    assert redact("at rediss://user:pw@h:1/2 and http://tok@w:8000/x") == (
        "at rediss://***@h:1/2 and http://***@w:8000/x"
    )
    assert redact("http://w:8000/v1?token=abc&x=1") == "http://w:8000/v1?token=***&x=1"
    assert redact("no url here") == "no url here"


def test_the_log_filter_redacts_rendered_messages() -> None:
    record = logging.LogRecord(
        "x", logging.WARNING, __file__, 1, "store %s down", ("redis://:pw@h",), None
    )
    assert RedactingFilter().filter(record)
    assert record.getMessage() == "store redis://***@h down"


async def test_the_redis_password_is_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://:s3cret-pass@127.0.0.1:{free_port()}/0"
    store = RedisStore(url, backoff_initial=3600, **PATIENT)
    try:
        # The logger's own level: an in-process demo run leaves "kvgate" at ERROR.
        with caplog.at_level(logging.DEBUG, logger="kvgate.store.redis_store"):
            assert await store.get("s") is None
            assert store.degraded
            assert not await store.try_recover()
    finally:
        await store.close()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "degraded" in text
    assert "s3cret" not in text


async def test_after_a_restart_the_store_recovers_once_and_stays_up(
    own_server: RedisServer,
) -> None:
    """Stale pooled connections once flipped the store back to degraded again and again."""
    store = RedisStore(own_server.url, backoff_initial=0.02, backoff_max=0.1, **PATIENT)
    metrics = GatewayMetrics()
    metrics.watch_store(store.health)
    try:
        # Fill the pool with several connections, all of which the restart kills.
        await asyncio.gather(*(store.get(f"s{i}") for i in range(16)))
        own_server.stop()
        assert await store.get("s0") is None
        assert store.degraded
        own_server.start()
        await wait_until(lambda: not store.degraded, timeout=10, message="recovery")
        for _ in range(5):
            await asyncio.gather(
                *(store.set(Affinity(f"s{i}", "w", "v1"), 60.0) for i in range(16))
            )
        health = store.health()
        assert not health.degraded
        assert (health.degraded_total, health.resyncs_total) == (1, 1)
        text = metrics.render().decode()
        assert "kvgate_store_degraded 0.0" in text
        assert "kvgate_store_degraded_episodes_total 1.0" in text
        assert "kvgate_store_resyncs_total 1.0" in text
        errors = [
            line
            for line in text.splitlines()
            if line.startswith("kvgate_store_backend_errors_total")
        ]
        assert errors and float(errors[0].split()[-1]) >= 1
    finally:
        await store.close()


class FlakyRedis(Redis):
    """A client whose next ``lost`` commands time out: before reaching Redis, or, with
    ``landed``, after Redis ran them (the reply is what got lost)."""

    lost = 0
    landed = False

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if not self.lost:
            return await super().execute_command(*args, **options)
        self.lost -= 1
        if self.landed:
            await super().execute_command(*args, **options)
        raise RedisTimeoutError("Timeout reading from socket (injected)")


def flaky_store(url: str) -> tuple[RedisStore, FlakyRedis]:
    client = FlakyRedis.from_url(url, socket_timeout=1.0, socket_connect_timeout=2.0)
    return RedisStore(url, client=client, backoff_initial=3600.0), client


@pytest.mark.parametrize("landed", [False, True], ids=["before-redis", "reply-lost"])
async def test_one_timeout_is_retried_so_replicas_still_agree(redis_url: str, landed: bool) -> None:
    """A loaded host once missed one deadline and the replica bound sessions alone."""
    store, client = flaky_store(redis_url)
    other = RedisStore(redis_url, **PATIENT)
    try:
        client.lost, client.landed = 1, landed
        mine = await store.compare_and_set("s", None, Affinity("s", "A", "v1"), 60.0)
        theirs = await other.compare_and_set("s", None, Affinity("s", "B", "v1"), 60.0)
        # A lost reply is the ambiguous case: the retry finds its own binding in force.
        assert mine == theirs == Affinity("s", "A", "v1", mine.last_active)
        health = store.health()
        assert not health.degraded
        assert (health.errors_total, health.fallbacks_total, health.degraded_total) == (1, 0, 0)
    finally:
        await store.close()
        await other.close()


async def test_two_timeouts_in_a_row_are_an_outage(redis_url: str) -> None:
    store, client = flaky_store(redis_url)
    try:
        client.lost = 2
        bound = await store.compare_and_set("s", None, Affinity("s", "A", "v1"), 60.0)
        assert bound.worker == "A"  # answered from the local map
        health = store.health()
        assert health.degraded
        assert (health.errors_total, health.fallbacks_total, health.degraded_total) == (2, 1, 1)
    finally:
        await store.close()


async def test_recovery_leaves_connections_in_use_alone(redis_url: str) -> None:
    """Closing one under a call still connecting raised a bare RuntimeError out of the store."""
    store, client = flaky_store(redis_url)
    try:
        client.lost = 2
        await store.get("s")
        assert store.degraded
        busy = await client.connection_pool.get_connection()  # a call's, mid-flight
        try:
            assert busy.is_connected
            assert await store.try_recover()
            assert busy.is_connected
        finally:
            await client.connection_pool.release(busy)
        assert await store.get("s") is None
    finally:
        await store.close()
