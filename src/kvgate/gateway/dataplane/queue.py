"""The admission queue: where requests wait, bounded, for a worker to free up.

Waiters are woken highest priority first, oldest first within a priority,
whenever a request finishes or a worker becomes routable. The queue never
decides to route: a woken waiter asks the policy again.
"""

from __future__ import annotations

import asyncio
from collections import deque

from kvgate.types import Priority


class AdmissionQueue:
    """A bounded, priority-ordered set of waiters for one gateway (all models)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._waiters: dict[Priority, deque[asyncio.Future[None]]] = {
            p: deque() for p in sorted(Priority, reverse=True)
        }
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def full(self) -> bool:
        """True when no more requests may wait."""
        return self._size >= self.capacity

    async def wait(self, priority: Priority, max_wait_s: float) -> bool:
        """Wait until woken (True) or until ``max_wait_s`` passes (False)."""
        if max_wait_s <= 0 or self.full:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiters[priority]
        queue.append(fut)
        self._size += 1
        try:
            async with asyncio.timeout(max_wait_s):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            if not fut.done():
                fut.cancel()
            try:
                queue.remove(fut)
                self._size -= 1
            except ValueError:
                pass

    def wake_one(self) -> None:
        """A slot freed up: let the most important, oldest waiter try again."""
        if not self._size:
            return
        for queue in self._waiters.values():
            while queue:
                fut = queue.popleft()
                self._size -= 1
                if not fut.done():
                    fut.set_result(None)
                    return

    def wake_all(self) -> None:
        """The fleet changed (a worker came back): every waiter tries again."""
        for queue in self._waiters.values():
            while queue:
                fut = queue.popleft()
                self._size -= 1
                if not fut.done():
                    fut.set_result(None)
