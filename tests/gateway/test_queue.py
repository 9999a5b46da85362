"""The admission queue wakes the most important, oldest waiter first and stays bounded."""

from __future__ import annotations

import asyncio

from kvgate.gateway.dataplane.queue import AdmissionQueue, DisplacedError
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


async def test_counts_waiters_per_tenant_and_gives_the_newest_place_away() -> None:
    queue = AdmissionQueue(capacity=10)
    results: dict[str, object] = {}

    async def wait(
        name: str, tenant: str, priority: Priority = Priority.STANDARD, hold: bool = False
    ) -> None:
        try:
            results[name] = await queue.wait(priority, 5.0, tenant, hold=hold)
        except DisplacedError:
            results[name] = "displaced"

    tasks = [
        asyncio.create_task(wait("a1", "a")),
        asyncio.create_task(wait("a2", "a")),
        asyncio.create_task(wait("a-crit", "a", Priority.CRITICAL)),
        asyncio.create_task(wait("hold", "a", hold=True)),  # a KV hold: never displaced
    ]
    await wait_until(lambda: len(queue) == 4)
    assert queue.waiting == {"a": [0, 2, 1]}
    late = asyncio.create_task(
        queue.wait(Priority.STANDARD, 5.0, "b", displaces=("a", Priority.STANDARD))
    )
    await wait_until(lambda: "a2" in results)
    assert results == {"a2": "displaced"}  # the newest, at the priority named
    assert len(queue) == 4
    assert queue.waiting == {"a": [0, 1, 1], "b": [0, 1, 0]}
    queue.wake_all()
    await asyncio.gather(*tasks)
    assert await late
    assert results == {"a2": "displaced", "a1": True, "a-crit": True, "hold": True}
    assert len(queue) == 0 and queue.waiting == {}


async def test_a_wait_that_ends_leaves_no_count_behind() -> None:
    queue = AdmissionQueue(capacity=10)
    assert not await queue.wait(Priority.STANDARD, 0.01, "a")
    task = asyncio.create_task(queue.wait(Priority.STANDARD, 5.0, "a"))
    await wait_until(lambda: len(queue) == 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert len(queue) == 0 and queue.waiting == {}


async def test_tenants_take_turns_within_a_priority() -> None:
    queue = AdmissionQueue(capacity=10)
    order: list[str] = []

    async def wait(name: str, tenant: str, priority: Priority = Priority.STANDARD) -> None:
        assert await queue.wait(priority, 5.0, tenant, hold=name.endswith("hold"))
        order.append(name)

    tasks = []
    for name, tenant in (
        ("flood-1", "flood"),
        ("flood-2", "flood"),
        ("flood-3", "flood"),
        ("quiet-1", "quiet"),
        ("flood-hold", "flood"),  # a KV hold takes its turn with its tenant's
        ("other-1", "other"),
        ("quiet-2", "quiet"),
    ):
        tasks.append(asyncio.create_task(wait(name, tenant)))
        count = len(tasks)
        await wait_until(lambda n=count: len(queue) == n)  # type: ignore[misc]
    tasks.append(asyncio.create_task(wait("critical", "flood", Priority.CRITICAL)))
    await wait_until(lambda: len(queue) == 8)
    for expected in range(1, 9):
        queue.wake_one()
        await wait_until(lambda n=expected: len(order) == n)  # type: ignore[misc]
    await asyncio.gather(*tasks)
    # Before, oldest first: the flood's three, then the quiet tenant's, after the flood's.
    assert order == [
        "critical",
        "flood-1",
        "quiet-1",
        "other-1",
        "flood-2",
        "quiet-2",
        "flood-3",
        "flood-hold",
    ]
    assert len(queue) == 0 and queue.waiting == {}


async def test_wake_all_wakes_in_turn() -> None:
    queue = AdmissionQueue(capacity=10)
    order: list[str] = []

    async def wait(name: str, tenant: str) -> None:
        assert await queue.wait(Priority.STANDARD, 5.0, tenant)
        order.append(name)

    tasks = []
    for name, tenant in (("a-1", "a"), ("a-2", "a"), ("b-1", "b")):
        tasks.append(asyncio.create_task(wait(name, tenant)))
        count = len(tasks)
        await wait_until(lambda n=count: len(queue) == n)  # type: ignore[misc]
    queue.wake_all()
    await asyncio.gather(*tasks)
    assert order == ["a-1", "b-1", "a-2"]
