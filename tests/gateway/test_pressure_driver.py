"""The pressure driver on synthetic scrapes: levels, heat drains, counters, session sizes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kvgate.core.fleet import Health, Pressure
from kvgate.gateway.app import Gateway
from kvgate.gateway.config import parse_config
from kvgate.gateway.control.pressure import SessionContexts
from kvgate.gateway.observe.pool import Worker
from kvgate.gateway.observe.scrape import WorkerSignals

URL = "http://127.0.0.1:9"
N, S, H = Pressure.NORMAL, Pressure.SOFT, Pressure.HARD


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    gw = Gateway(parse_config({"workers": [{"url": URL, "model": "demo"}]}))
    worker = gw.pool.get(URL)
    assert worker is not None
    worker.update(probe_ok=True)
    yield gw
    await gw.stop()


def scrape(gw: Gateway, **signals: float | int | None) -> Worker:
    worker = gw.pool.get(URL)
    assert worker is not None
    sig = WorkerSignals(engine="vllm", **signals)  # type: ignore[arg-type]
    worker.update(signals=sig, signals_at=gw.pressure.mono())
    gw.pressure.observe(worker, sig)
    return worker


async def test_levels_follow_watermarks_with_hysteresis_and_unknown_keeps_the_level(
    gateway: Gateway,
) -> None:
    levels = [
        scrape(gateway, kv_usage=usage).pressure
        for usage in (0.5, 0.86, 0.96, 0.91, None, 0.89, 0.81, 0.79)
    ]
    assert levels == [N, S, H, H, H, S, S, N]


async def test_gpu_memory_counts_as_much_as_kv(gateway: Gateway) -> None:
    worker = scrape(gateway, kv_usage=0.2, gpu_mem_usage=0.9)
    assert worker.pressure is Pressure.SOFT


async def test_a_hot_gpu_is_held_soft_then_drained_until_it_cools(gateway: Gateway) -> None:
    states = []
    for temp in (80.0, 84.0, 91.0, 88.0, 86.0, 82.0, 79.0):
        worker = scrape(gateway, kv_usage=0.1, gpu_temp_c=temp)
        state = worker.state(gateway.pressure.mono(), 10.0)
        states.append((state.pressure, state.health))
    ok, draining = Health.HEALTHY, Health.DRAINING
    assert states == [
        (N, ok),
        (S, ok),
        (S, draining),
        (S, draining),  # within temp_recovery_c of the drain limit
        (S, ok),
        (S, ok),  # within temp_recovery_c of the soft limit
        (N, ok),
    ]
    rendered = gateway.metrics.render().decode()
    assert f'kvgate_worker_drains_total{{cause="temperature",worker="{URL}"}} 1.0' in rendered


async def test_an_admin_drain_outlasts_a_cooled_gpu(gateway: Gateway) -> None:
    worker = scrape(gateway, gpu_temp_c=95.0)
    assert gateway.pressure.set_admin_drain(worker, True)
    assert scrape(gateway, gpu_temp_c=40.0).draining
    assert gateway.pressure.set_admin_drain(worker, False)
    assert not worker.draining


async def test_preemptions_count_increases_and_survive_a_counter_reset(gateway: Gateway) -> None:
    for total in (100, 103, 110, 2, 5):
        scrape(gateway, preemptions_total=total)
    rendered = gateway.metrics.render().decode()
    # +3, +7, reset (base 2), +3: the first reading is only the base.
    assert f'kvgate_worker_preemptions_total{{worker="{URL}"}} 13.0' in rendered


async def test_a_hard_worker_without_sessions_plans_nothing(gateway: Gateway) -> None:
    worker = scrape(gateway, kv_usage=0.97)
    assert worker.pressure is Pressure.HARD
    assert await gateway.pressure.relieve(worker) == []


def test_session_contexts_are_bounded_and_estimate_the_unknown() -> None:
    contexts = SessionContexts(limit=2, default_tokens=500)
    assert contexts.tokens("x") == 500
    contexts.record("a", 100)
    contexts.record("b", 300)
    contexts.record("a", 200)  # refreshes a
    contexts.record("c", 400)  # evicts b, the least recently updated
    assert len(contexts) == 2
    assert (contexts.tokens("a"), contexts.tokens("c")) == (200, 400)
    assert contexts.tokens("b") == 300  # unknown now: the mean of those known
