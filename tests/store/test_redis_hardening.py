"""Redis outages as an operator sees them: no secret in the log, no flapping, counted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

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
