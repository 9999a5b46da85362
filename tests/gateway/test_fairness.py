"""One tenant's flood does not take the other tenants' room: the admission queue, the
retry budget.

Two client keys before one worker that takes one request at a time and never answers
(so every later request waits): the flooding key fills the queue's standard share; a
request of the other key still finds a place, the flood's newest giving it up (429,
``queue_share``), while the flood's own next request is refused as on a one-tenant
gateway (429, ``queue_full``). A tenant whose requests fail on every worker leaves the
budget's last retry to another. Every refusal is in the OpenAI error shape.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from kvgate.gateway.embedded import GatewayHandle
from kvgate.gateway.testing import running_gateway
from kvgate.tasks import cancel_and_wait
from kvgate.testing import wait_until

from .conftest import every_worker_up, gateway_config, set_faults, worker_fleet

pytestmark = pytest.mark.usefixtures("both_servers")

FLOOD = "sk-flood-0123456789abcdef"
QUIET = "sk-quiet-0123456789abcdef"
BODY = {"model": "demo", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


async def post(session: aiohttp.ClientSession, gw: GatewayHandle, key: str) -> tuple[int, Any, str]:
    """One chat request under ``key``: its status, JSON body and ``Retry-After``."""
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(f"{gw.url}/v1/chat/completions", json=BODY, headers=headers) as resp:
        return resp.status, await resp.json(), resp.headers.get("Retry-After", "")


def refused(answer: tuple[int, Any, str], reason: str) -> None:
    status, body, retry_after = answer
    assert status == 429, body
    assert set(body) == {"error"}
    error = body["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "overloaded"
    assert reason in error["message"]
    assert int(retry_after) >= 1


async def test_a_flooding_tenant_gives_up_its_newest_place_to_another_tenant() -> None:
    async with worker_fleet(1) as fleet:
        await set_faults(fleet[0], hang=True)
        config = gateway_config(
            fleet,
            api_keys=[{"key": FLOOD, "name": "flood"}, {"key": QUIET, "name": "quiet"}],
            # One slot; a queue of 4 of which standard requests may fill 3.
            admission={"worker_max_in_flight": 1, "queue_size": 4, "max_wait_standard_s": 60},
        )
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await every_worker_up(gw)
            queue, pool = gw.gateway.queue, gw.gateway.pool
            pending: list[asyncio.Task[tuple[int, Any, str]]] = []
            try:
                pending.append(asyncio.create_task(post(session, gw, FLOOD)))
                await wait_until(lambda: pool.in_flight() == 1)
                for n in (1, 2, 3):
                    pending.append(asyncio.create_task(post(session, gw, FLOOD)))
                    await wait_until(lambda n=n: len(queue) == n)  # type: ignore[misc]
                # The flood's own next request: no one holds more than it, refused.
                refused(await post(session, gw, FLOOD), "queue_full")
                # The quiet key's request takes the place of the flood's newest.
                pending.append(asyncio.create_task(post(session, gw, QUIET)))
                first, _ = await asyncio.wait(pending[3:], return_when=asyncio.FIRST_COMPLETED)
                assert first == {pending[3]}, [t.result() for t in first]
                refused(pending[3].result(), "queue_share")
                await wait_until(lambda: len(queue.waiting) == 2)
                (flood,) = {t for t in queue.waiting if queue.waiting[t][1] == 2}
                quiet = next(t for t in queue.waiting if t != flood)
                assert queue.waiting == {flood: [0, 2, 0], quiet: [0, 1, 0]}
                assert len(queue) == 3
                # Its next: the flood holds only one more, so it is refused too.
                refused(await post(session, gw, QUIET), "queue_full")
                assert not any(task.done() for task in pending[:3] + pending[4:])
            finally:
                await cancel_and_wait(*pending)


async def test_a_flooding_tenants_poison_requests_leave_the_last_retry_to_another() -> None:
    """Two retries in flight at most. Worker 0 never answers, worker 1 answers 500; round
    robin sends each request to the next in turn. The quiet key's request waits on worker
    0; the flood's first request fails on worker 1 and is retried (it waits on worker 0);
    its second fails there too and is refused its retry (502): the last retry is left to
    the tenant holding fewer, which the quiet key's next failing request then gets.
    On the code before, the flood's second request took it and the quiet one's got 502."""
    async with worker_fleet(2) as fleet:
        await set_faults(fleet[0], hang=True)
        await set_faults(fleet[1], error_rate=1.0)
        config = gateway_config(
            fleet,
            api_keys=[FLOOD, QUIET],
            policy={"name": "round_robin"},
            retries={"count": 1, "budget_ratio": 0.0, "budget_min": 2},
            outlier={"consecutive_failures": 100},
        )
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await every_worker_up(gw)
            pool, budget = gw.gateway.pool, gw.gateway.budget
            pending: list[asyncio.Task[tuple[int, Any, str]]] = []
            try:
                pending.append(asyncio.create_task(post(session, gw, QUIET)))  # worker 0
                await wait_until(lambda: pool.in_flight() == 1)
                pending.append(asyncio.create_task(post(session, gw, FLOOD)))  # 1, then 0
                await wait_until(lambda: budget.retries == 1 and pool.in_flight() == 2)
                async with asyncio.timeout(10):  # before: retried, and waits on worker 0
                    status, body, _ = await post(session, gw, FLOOD)  # worker 1, no retry
                assert status == 502, body
                assert set(body) == {"error"} and body["error"]["code"] == "upstream_error"
                assert budget.retries == 1
                pending.append(asyncio.create_task(post(session, gw, QUIET)))  # worker 0
                await wait_until(lambda: pool.in_flight() == 3)
                pending.append(asyncio.create_task(post(session, gw, QUIET)))  # 1, then 0
                await wait_until(lambda: budget.retries == 2 and pool.in_flight() == 4)
                assert not any(task.done() for task in pending)
            finally:
                await cancel_and_wait(*pending)
