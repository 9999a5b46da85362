"""A deadline timer re-armed lazily: a connection's deadlines without a timer per request.

A keep-alive connection moves through deadlines on every request (the head's,
the body's, keep-alive's; the worker's first byte), each seconds away, while
the request itself takes well under a millisecond. Cancelling one timer and
scheduling the next on every step costs about a microsecond each in uvloop,
several times a request. ``LazyTimer`` keeps one scheduled callback instead:
setting a later deadline only records it, and when the callback fires early it
schedules itself again for the deadline now in force. A deadline that moves
earlier (or the first one) still schedules at once, so nothing fires late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class LazyTimer:
    """One pending deadline and its action; the scheduled callback is kept across changes."""

    __slots__ = ("_action", "_at", "_due", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0
        """When the scheduled callback fires (loop time)."""
        self._due = 0.0
        self._action: Callable[[], None] | None = None

    def arm(self, delay: float, action: Callable[[], None]) -> None:
        """Call ``action`` ``delay`` seconds from now (replacing any deadline set before)."""
        self.arm_at(self._loop.time() + delay, action)

    def arm_at(self, due: float, action: Callable[[], None]) -> None:
        """Call ``action`` at loop time ``due`` (replacing any deadline set before)."""
        self._due = due
        self._action = action
        handle = self._handle
        if handle is None or self._at > due:
            if handle is not None:
                handle.cancel()
            self._at = due
            self._handle = self._loop.call_at(due, self._fire)

    def disarm(self) -> None:
        """No deadline: the scheduled callback, if any, will find nothing to do."""
        self._action = None

    def cancel(self) -> None:
        """No deadline, and nothing scheduled (the connection is going away)."""
        self._action = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    @property
    def armed(self) -> bool:
        """True while a deadline is set."""
        return self._action is not None

    def _fire(self) -> None:
        self._handle = None
        action = self._action
        if action is None:
            return
        if self._at < self._due:
            # Scheduled for an earlier deadline that has since moved later.
            self._at = self._due
            self._handle = self._loop.call_at(self._due, self._fire)
            return
        self._action = None
        action()
