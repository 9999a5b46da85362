"""One client's poison request must not cost other clients their service (issue 45, item 4).

A request every worker answers with 500, sent many at a time, spends the retry
budget: most copies get no second opinion. Those failures are not the workers'
to carry, so no healthy worker is ejected, and a model served by one worker keeps
serving its other clients.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import aiohttp
import pytest

from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import wait_until

from .conftest import fake_fleet
from .fake_worker import fake_workers

pytestmark = pytest.mark.usefixtures("both_servers")

POISON = 120


async def test_concurrent_poison_ejects_no_healthy_worker() -> None:
    async with fake_workers(3) as fakes:
        # Two workers serve "demo", the third alone serves "solo".
        models = ["demo", "demo", "solo"]
        config: dict[str, Any] = {
            "workers": [{"url": f.url, "model": m} for f, m in zip(fakes, models, strict=True)],
            "health": {"interval_s": 0.1, "timeout_s": 2.0},
            "retries": {"backoff_base_s": 0.0, "backoff_max_s": 0.0},
        }
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await wait_until(
                lambda: all(w.probe_ok for w in gw.gateway.pool), message="every worker up"
            )
            await _burst(gw, session)


async def _burst(gw: GatewayHandle, session: aiohttp.ClientSession) -> None:
    """Poison both models at once while another client of "solo" keeps asking."""
    ejected: set[str] = set()
    statuses: Counter[int] = Counter()
    others: Counter[int] = Counter()
    done = asyncio.Event()

    def watch() -> None:
        ejected.update(w.id for w in gw.gateway.pool if w.ejected)

    async def post(model: str, prompt: str, into: Counter[int]) -> None:
        body = {"model": model, "prompt": prompt}
        async with session.post(gw.openai_base + "/completions", json=body) as resp:
            await resp.read()
            into[resp.status] += 1
        watch()

    async def other_client() -> None:
        while not done.is_set():
            await post("solo", "hello", others)

    client = asyncio.create_task(other_client())
    poison = [post("demo", "mode:poison", statuses) for _ in range(POISON)]
    poison += [post("solo", "mode:poison", statuses) for _ in range(POISON)]
    await asyncio.gather(*poison)
    # The other client goes on after the burst, where an ejection would show as 503s.
    after = sum(others.values())
    while sum(others.values()) < after + 20:
        await post("solo", "hello", others)
    done.set()
    await client
    watch()
    assert statuses.keys() <= {502}, statuses
    assert ejected == set(), f"healthy workers ejected: {ejected}"
    assert set(others) == {200}, others
    for worker in gw.gateway.pool:
        assert gw.gateway.health.outlier.ejection_count(worker.id) == 0


@pytest.mark.parametrize(
    "value",
    [
        pytest.param([2**64], id="token-past-64-bits"),
        pytest.param([2**31], id="token-past-32-bits"),
        pytest.param([-1], id="negative-token"),
        pytest.param([1.5], id="float-token"),
        pytest.param([True], id="bool-token"),
        pytest.param([[1, 2], [2**40]], id="nested-token-past-range"),
        pytest.param([[]], id="empty-nested"),
        pytest.param([], id="empty"),
        pytest.param(["a", 1], id="mixed"),
        pytest.param({"a": 1}, id="object"),
        pytest.param(None, id="null"),
    ],
)
async def test_embeddings_input_no_engine_takes_is_400(value: object) -> None:
    async with fake_fleet(1) as (gw, fakes), aiohttp.ClientSession() as session:
        seen = len(fakes[0].requests)
        body = json.dumps({"model": "demo", "input": value})
        async with session.post(
            gw.openai_base + "/embeddings", data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == "input" or "input" in error["message"]
        posted = [r for r in fakes[0].requests[seen:] if r[0] == "/v1/embeddings"]
        assert posted == []


@pytest.mark.parametrize(
    "value",
    ["text", ["a", "b"], [0, 1, 2**31 - 1], [[1, 2], [3]]],
)
async def test_embeddings_inputs_openai_takes_are_forwarded(value: object) -> None:
    async with (
        fake_fleet(1) as (gw, _),
        aiohttp.ClientSession() as session,
        session.post(
            gw.openai_base + "/embeddings", json={"model": "demo", "input": value}
        ) as resp,
    ):
        assert resp.status == 200
