"""A worker's metrics page cannot stall the gateway: capped, filtered, parsed off the loop."""

from __future__ import annotations

import logging
import threading

import pytest

from kvgate.gateway.observe import health
from kvgate.gateway.observe.scrape import parse_worker_metrics
from kvgate.testing import wait_until

from .conftest import fake_fleet


def _series(name: str, count: int) -> bytes:
    return "".join(f'{name}{{id="{i}"}} 1\n' for i in range(count)).encode()


async def test_a_page_over_the_cap_is_not_read(caplog: pytest.LogCaptureFixture) -> None:
    async with fake_fleet(1, health={"interval_s": 0.05, "timeout_s": 2.0,
                                     "max_scrape_bytes": 100_000}) as (gw, (fake,)):  # fmt: skip
        fake.metrics_page = _series("vllm:num_requests_running", 200_000)
        (worker,) = list(gw.gateway.pool)
        # The logger's own level: an in-process demo run leaves "kvgate" at ERROR.
        with caplog.at_level(logging.WARNING, logger="kvgate.gateway.observe.health"):
            await wait_until(
                lambda: any("over 100000 bytes" in r.getMessage() for r in caplog.records),
                message="the oversized page noticed",
            )
        assert sum("over 100000 bytes" in r.getMessage() for r in caplog.records) == 1
        assert worker.probe_ok  # health is /health's to say, not the metrics page's


def test_other_exporters_series_are_skipped_before_parsing() -> None:
    page = _series("node_cpu_seconds_total", 50_000).decode()
    page += "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
    page += "vllm:kv_cache_usage_perc 0.25\n"
    signals = parse_worker_metrics(page)
    assert (signals.engine, signals.running, signals.kv_usage) == ("vllm", 3, 0.25)


async def test_a_large_page_is_parsed_on_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    real = health.parse_worker_metrics

    def spy(text: str, *, now: float | None = None) -> object:
        threads.append(threading.current_thread().name)
        return real(text, now=now)

    monkeypatch.setattr(health, "parse_worker_metrics", spy)
    async with fake_fleet(1) as (gw, (fake,)):
        fake.metrics_page = _series("vllm:num_requests_running", 20_000)  # ~0.9 MB
        (worker,) = list(gw.gateway.pool)
        await wait_until(
            lambda: worker.signals is not None and worker.signals.running == 20_000,
            message="the big page parsed",
        )
    main = threading.main_thread().name
    assert any(name != main for name in threads)
