"""Stopping background tasks: the task's cancellation is swallowed, the caller's never."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kvgate.tasks import cancel_and_wait


class BoomError(Exception):
    """An error of the task's own."""


async def _forever(started: asyncio.Event, ended: list[str], name: str = "task") -> None:
    started.set()
    try:
        await asyncio.Event().wait()
    finally:
        ended.append(name)


async def _start(name: str, ended: list[str]) -> asyncio.Task[None]:
    started = asyncio.Event()
    task = asyncio.create_task(_forever(started, ended, name))
    await started.wait()
    return task


async def test_a_running_task_is_cancelled_and_has_ended_on_return() -> None:
    ended: list[str] = []
    task = await _start("loop", ended)
    await cancel_and_wait(task)
    assert task.cancelled()
    assert ended == ["loop"]


async def test_none_and_nothing_are_nothing_to_stop() -> None:
    await cancel_and_wait()
    await cancel_and_wait(None, None)


async def test_a_task_that_already_finished_is_left_as_it_ended() -> None:
    async def answer() -> int:
        return 42

    task = asyncio.create_task(answer())
    await task
    await cancel_and_wait(task)
    assert not task.cancelled()
    assert task.result() == 42


async def test_a_task_never_started_is_cancelled_before_its_first_step() -> None:
    ended: list[str] = []
    task = asyncio.create_task(_forever(asyncio.Event(), ended))
    await cancel_and_wait(task)
    assert task.cancelled()
    assert ended == []  # a coroutine cancelled before it ran has no ``finally`` to run


async def test_an_error_of_the_task_is_raised_as_await_would() -> None:
    async def failing() -> None:
        raise BoomError("crashed before the stop")

    task = asyncio.create_task(failing())
    await asyncio.wait([task])
    with pytest.raises(BoomError, match="crashed before the stop"):
        await cancel_and_wait(task)


async def test_an_error_raised_while_cancelled_is_raised_too() -> None:
    started = asyncio.Event()

    async def failing_cleanup() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            raise BoomError("cleanup failed")

    task = asyncio.create_task(failing_cleanup())
    await started.wait()
    with pytest.raises(BoomError, match="cleanup failed"):
        await cancel_and_wait(task)


async def test_every_task_ends_before_the_first_error_is_raised_and_the_rest_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def failing(message: str) -> None:
        raise BoomError(message)

    ended: list[str] = []
    first, second = asyncio.create_task(failing("first")), asyncio.create_task(failing("second"))
    await asyncio.wait([first, second])
    loop = await _start("loop", ended)
    with (
        caplog.at_level(logging.ERROR, logger="kvgate.tasks"),
        pytest.raises(BoomError, match="first"),
    ):
        await cancel_and_wait(first, loop, second)
    assert loop.cancelled() and ended == ["loop"]
    assert [r.exc_info[1] for r in caplog.records if r.exc_info] == [second.exception()]


async def test_the_callers_cancellation_while_it_waits_is_raised_not_swallowed() -> None:
    started, release, waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
    after: list[str] = []

    async def slow_to_stop() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            waiting.set()
            await asyncio.shield(release.wait())  # a cleanup that takes a while

    async def stopper(task: asyncio.Task[None]) -> None:
        await cancel_and_wait(task)
        after.append("went on as though stopped")

    task = asyncio.create_task(slow_to_stop())
    await started.wait()
    caller = asyncio.create_task(stopper(task))
    await waiting.wait()
    caller.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert caller.cancelled()
    assert after == []
    await asyncio.wait([task])
    assert task.cancelled()


async def test_a_timeout_around_the_stop_fires() -> None:
    """``asyncio.timeout`` cancels the caller; a swallowed cancellation would defeat it
    (the block would end as though in time, and no ``TimeoutError`` be raised)."""
    ended: list[str] = []
    task = await _start("loop", ended)
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout_at(loop.time()):  # already due: fires at the first wait
            await cancel_and_wait(task)
    assert task.cancelled() and ended == ["loop"]


async def test_a_task_that_swallows_its_cancel_does_not_hide_the_callers() -> None:
    started, cancel_seen = asyncio.Event(), asyncio.Event()

    async def stubborn() -> str:
        started.set()
        for _ in range(2):  # its own cancellation, then the caller's passed on to it
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancel_seen.set()  # the first time: the caller is now waiting on it
        return "carried on"

    task = asyncio.create_task(stubborn())
    await started.wait()
    caller = asyncio.create_task(cancel_and_wait(task))
    await cancel_seen.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert task.result() == "carried on"


async def test_a_stop_inside_a_cancelled_tasks_cleanup_still_waits_for_its_task() -> None:
    """A caller cancelled *before* the call (a ``finally`` of its own) is not re-raised
    here: the stop finishes, so the cleanup after it runs, as it did before the helper."""
    ended: list[str] = []
    cleaned: list[str] = []
    started = asyncio.Event()

    async def owner() -> None:
        inner = await _start("inner", ended)
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(inner)
            cleaned.append("after the stop")

    task = asyncio.create_task(owner())
    await started.wait()
    await cancel_and_wait(task)
    assert ended == ["inner"]
    assert cleaned == ["after the stop"]
