"""``LazyTimer``: deadlines moved later keep the scheduled callback, and nothing fires late."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

from kvgate.gateway.timers import LazyTimer


class _Handle:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Clock:
    """The two loop methods ``LazyTimer`` uses, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.scheduled: list[_Handle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> _Handle:
        handle = _Handle(when, callback)
        self.scheduled.append(handle)
        return handle

    def advance(self, to: float) -> None:
        """Run every callback due by ``to``, in time order, the clock at each one's time."""
        while True:
            due = [h for h in self.scheduled if not h.cancelled and h.when <= to]
            if not due:
                break
            first = min(due, key=lambda h: h.when)
            self.scheduled.remove(first)
            self.now = first.when
            first.callback()
        self.now = to

    def pending(self) -> int:
        return sum(not h.cancelled for h in self.scheduled)


def _timer() -> tuple[_Clock, LazyTimer, list[float]]:
    clock = _Clock()
    fired: list[float] = []
    timer = LazyTimer(cast(asyncio.AbstractEventLoop, clock))
    return clock, timer, fired


def test_fires_at_its_deadline() -> None:
    clock, timer, fired = _timer()
    timer.arm(10.0, lambda: fired.append(clock.now))
    clock.advance(9.9)
    assert fired == []
    clock.advance(20.0)
    assert fired == [10.0]
    assert not timer.armed


def test_a_later_deadline_keeps_the_callback_and_fires_then() -> None:
    clock, timer, fired = _timer()
    timer.arm(10.0, lambda: fired.append(-1.0))
    clock.advance(5.0)
    timer.arm(10.0, lambda: fired.append(clock.now))  # now due at 15
    assert clock.pending() == 1  # nothing rescheduled
    clock.advance(14.9)
    assert fired == []
    clock.advance(30.0)
    assert fired == [15.0]


def test_an_earlier_deadline_reschedules_at_once() -> None:
    clock, timer, fired = _timer()
    timer.arm(75.0, lambda: fired.append(-1.0))
    timer.arm(10.0, lambda: fired.append(clock.now))
    clock.advance(100.0)
    assert fired == [10.0]


def test_disarmed_never_fires_and_cancel_unschedules() -> None:
    clock, timer, fired = _timer()
    timer.arm(1.0, lambda: fired.append(clock.now))
    timer.disarm()
    clock.advance(5.0)
    assert fired == []
    timer.arm(1.0, lambda: fired.append(clock.now))
    timer.cancel()
    assert clock.pending() == 0
    clock.advance(10.0)
    assert fired == []


def test_many_requests_schedule_one_callback() -> None:
    """The per-request pattern (head, body, none, keep-alive) schedules nothing new."""
    clock, timer, fired = _timer()
    for i in range(1000):
        clock.advance(i * 0.001)
        timer.arm(10.0, lambda: fired.append(-1.0))
        timer.arm(30.0, lambda: fired.append(-2.0))
        timer.disarm()
        timer.arm(75.0, lambda: fired.append(clock.now))
    assert len(clock.scheduled) == 1
    clock.advance(2.0)
    assert fired == []
    clock.advance(200.0)
    assert fired == [0.999 + 75.0]
