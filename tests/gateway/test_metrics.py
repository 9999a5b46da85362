"""The gateway's own metrics: per-worker gauges at scrape time, health as a value, histograms."""

from __future__ import annotations

from dataclasses import replace

import pytest
from openai import AsyncOpenAI

from kvgate.gateway.observe.metrics import HEALTH_STATES, GatewayMetrics, WorkerGaugeRow
from kvgate.gateway.testing import running_gateway

from .conftest import every_worker_up, gateway_config, worker_fleet

ROW = WorkerGaugeRow(
    worker="http://w1",
    model="m",
    version="v1",
    in_flight=3,
    health="healthy",
    ejected=False,
    max_in_flight=8,
    pressure="soft",
    kv_in_flight_tokens=512,
    running=2,
    waiting=1,
    kv_usage=0.9,
    kv_capacity_tokens=65536,
    gpu_temp_c=71.0,
    gpu_mem_used_mib=1024.0,
    gpu_mem_total_mib=4096.0,
    scrape_age_s=0.25,
    signals_fresh=True,
)
LABELS = {"worker": "http://w1", "model": "m", "version": "v1"}


def value(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {**LABELS, **labels})


def test_every_signal_routing_reads_is_a_gauge_per_worker() -> None:
    rows = [ROW]
    metrics = GatewayMetrics(lambda: rows)
    assert value(metrics, "kvgate_worker_in_flight") == 3
    assert value(metrics, "kvgate_worker_max_in_flight") == 8
    assert value(metrics, "kvgate_worker_running_requests") == 2
    assert value(metrics, "kvgate_worker_waiting_requests") == 1
    assert value(metrics, "kvgate_worker_kv_usage_ratio") == 0.9
    assert value(metrics, "kvgate_worker_kv_in_flight_tokens") == 512
    assert value(metrics, "kvgate_worker_kv_capacity_tokens") == 65536
    assert value(metrics, "kvgate_worker_routing_pressure_level") == 1.0
    assert value(metrics, "kvgate_worker_gpu_temperature_celsius") == 71.0
    assert value(metrics, "kvgate_worker_gpu_memory_used_bytes") == 1024 * 2**20
    assert value(metrics, "kvgate_worker_gpu_memory_free_bytes") == 3072 * 2**20
    assert value(metrics, "kvgate_worker_scrape_age_seconds") == 0.25
    assert value(metrics, "kvgate_worker_signals_fresh") == 1.0


def test_unknown_readings_are_absent_not_zero() -> None:
    unknown = replace(
        ROW,
        running=None,
        waiting=None,
        kv_usage=None,
        kv_capacity_tokens=None,
        gpu_temp_c=None,
        gpu_mem_used_mib=None,
        gpu_mem_total_mib=None,
        scrape_age_s=None,
        signals_fresh=False,
    )
    metrics = GatewayMetrics(lambda: [unknown])
    for name in (
        "kvgate_worker_running_requests",
        "kvgate_worker_waiting_requests",
        "kvgate_worker_kv_usage_ratio",
        "kvgate_worker_kv_capacity_tokens",
        "kvgate_worker_gpu_temperature_celsius",
        "kvgate_worker_gpu_memory_used_bytes",
        "kvgate_worker_gpu_memory_free_bytes",
        "kvgate_worker_scrape_age_seconds",
    ):
        assert value(metrics, name) is None, name
    assert value(metrics, "kvgate_worker_signals_fresh") == 0.0
    assert value(metrics, "kvgate_worker_in_flight") == 3


@pytest.mark.parametrize("health", HEALTH_STATES)
def test_health_is_a_value_and_every_state_series_stays(health: str) -> None:
    rows = [ROW]
    metrics = GatewayMetrics(lambda: rows)
    rows[0] = replace(ROW, health=health)
    states = {s: value(metrics, "kvgate_worker_health_state", state=s) for s in HEALTH_STATES}
    assert states == {s: (1.0 if s == health else 0.0) for s in HEALTH_STATES}
    takes_traffic = health in ("healthy", "degraded")
    assert value(metrics, "kvgate_worker_healthy") == (1.0 if takes_traffic else 0.0)
    # The label set of kvgate_worker_healthy never carries the state.
    text = metrics.render().decode()
    healthy_lines = [ln for ln in text.splitlines() if ln.startswith("kvgate_worker_healthy{")]
    assert healthy_lines and all("state=" not in ln for ln in healthy_lines)


def test_created_series_only_when_asked_for() -> None:
    quiet, loud = GatewayMetrics(), GatewayMetrics(created=True)
    for m in (quiet, loud):
        m.requests.labels("m", "v1", "w", "200", "r").inc()
        m.ttft.labels("m", "v1", "w").observe(0.1)
    assert "_created" not in quiet.render().decode()
    assert "kvgate_requests_created" in loud.render().decode()
    # The samples themselves are all there.
    assert 'kvgate_requests_total{code="200"' in quiet.render().decode()
    assert "kvgate_time_to_first_token_seconds_count" in quiet.render().decode()


async def test_latency_histograms_and_decisions_are_labelled_by_worker() -> None:
    # Workers at a fifth of real time: the stream's 400 tokens take ~0.2 s, so its first and
    # last chunks reach the gateway apart however loaded the machine (at the fixture's time
    # scale of 50 the whole stream took under a millisecond, and a gateway descheduled that
    # long read it in one piece: no gap between chunks, no inter-token observation).
    async with (
        worker_fleet(2, time_scale=0.2) as workers,
        running_gateway(gateway_config(workers)) as gw,
    ):
        await every_worker_up(gw)
        client = AsyncOpenAI(base_url=gw.openai_base, api_key="x", max_retries=0)
        first = await client.chat.completions.with_raw_response.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert first.headers["x-kvgate-worker"]
        # A series appears with its first observation: no empty inter-token series yet.
        assert not any(
            s.name.startswith("kvgate_inter_token_latency_seconds")
            for f in gw.gateway.metrics.registry.collect()
            for s in f.samples
        )
        stream = await client.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "count to ten"}],
            # Long enough that its tokens come in several chunks past the first token (the
            # worker fuses a few milliseconds of decode steps into one chunk).
            max_tokens=400,
            stream=True,
        )
        chunks = [c async for c in stream]
        plain = await client.chat.completions.with_raw_response.create(
            model="demo", messages=[{"role": "user", "content": "hello"}], max_tokens=3
        )
        registry = gw.gateway.metrics.registry
    assert len(chunks) > 2
    worker = plain.headers["x-kvgate-worker"]
    labels = {"model": "demo", "version": plain.headers["x-kvgate-model-version"], "worker": worker}
    assert registry.get_sample_value("kvgate_time_to_first_token_seconds_count", labels) >= 1
    assert registry.get_sample_value("kvgate_request_duration_seconds_count", labels) >= 1
    itl = sum(
        s.value
        for f in registry.collect()
        for s in f.samples
        if s.name == "kvgate_inter_token_latency_seconds_count"
    )
    assert itl == 1  # the stream only: a whole-body answer has no inter-token gaps
    reason = plain.headers["x-kvgate-route-reason"]
    decided = registry.get_sample_value(
        "kvgate_route_decisions_total", {**labels, "reason": reason}
    )
    assert decided is not None and decided >= 1
