"""The real-time driver: model time runs ``time_scale`` times faster than real time."""

from __future__ import annotations

import asyncio

from openai import AsyncOpenAI

from kvgate.testing import wait_until
from kvgate.workersim import WorkerOptions, running_worker

SCALE = 4.0


async def test_model_time_is_scaled_real_time() -> None:
    options = WorkerOptions(port=0, profile="h100-llama3-8b", time_scale=SCALE)
    async with (
        running_worker(options) as worker,
        AsyncOpenAI(base_url=worker.url + "/v1", api_key="x", max_retries=0) as client,
    ):
        loop = asyncio.get_running_loop()
        driver = worker.worker.driver
        started, model_started = loop.time(), driver.now()
        await client.completions.create(model=options.model, prompt="count to ten", max_tokens=80)
        real = loop.time() - started
        model = driver.now() - model_started
        e2e = worker.engine.stats(driver.now()).e2e.sum
    assert abs(model - real * SCALE) < 0.05 * SCALE
    # The answer took its model latency divided by the scale, plus only overhead.
    assert e2e > 0.3  # 80 decode steps of a few ms each
    assert real >= 0.95 * e2e / SCALE
    assert real < e2e / SCALE + 1.0


async def test_idle_driver_waits_for_work() -> None:
    options = WorkerOptions(port=0, profile="fast")
    async with (
        running_worker(options) as worker,
        AsyncOpenAI(base_url=worker.url + "/v1", api_key="x", max_retries=0) as client,
    ):
        driver = worker.worker.driver
        await client.completions.create(model=options.model, prompt="one", max_tokens=3)
        await wait_until(lambda: not worker.engine.has_work() and driver.in_flight == 0)
        steps = driver.steps
        for _ in range(20):
            await asyncio.sleep(0)  # give a busy loop every chance to show itself
        assert driver.steps == steps
        assert driver.running
        await client.completions.create(model=options.model, prompt="two", max_tokens=3)
        assert driver.steps > steps
