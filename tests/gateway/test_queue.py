"""The admission queue wakes the most important, oldest waiter first and stays bounded."""

from __future__ import annotations

import asyncio

from kvgate.gateway.dataplane.queue import AdmissionQueue
from kvgate.testing import wait_until
from kvgate.types import Priority


async def test_wakes_by_priority_then_arrival() -> None:
    queue = AdmissionQueue(capacity=10)
    order: list[str] = []

    async def wait(name: str, priority: Priority) -> None:
        assert await queue.wait(priority, 5.0)
        order.append(name)

    tasks = [
        asyncio.create_task(wait("standard-1", Priority.STANDARD)),
        asyncio.create_task(wait("standard-2", Priority.STANDARD)),
        asyncio.create_task(wait("critical", Priority.CRITICAL)),
    ]
    await wait_until(lambda: len(queue) == 3)
    for expected in (1, 2, 3):
        queue.wake_one()
        await wait_until(lambda n=expected: len(order) == n)  # type: ignore[misc]
    await asyncio.gather(*tasks)
    assert order == ["critical", "standard-1", "standard-2"]
    assert len(queue) == 0


async def test_times_out_and_refuses_when_full() -> None:
    queue = AdmissionQueue(capacity=1)
    assert not await queue.wait(Priority.STANDARD, 0.0)
    waiter = asyncio.create_task(queue.wait(Priority.STANDARD, 5.0))
    await wait_until(lambda: queue.full)
    assert not await queue.wait(Priority.CRITICAL, 5.0)  # no room at all
    queue.wake_all()
    assert await waiter
    assert not await queue.wait(Priority.STANDARD, 0.01)
    assert len(queue) == 0
