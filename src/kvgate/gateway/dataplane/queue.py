"""The admission queue: where requests wait, bounded, for a worker to free up.

Waiters are woken highest priority first, oldest first within a priority,
whenever a request finishes or a worker becomes routable. The queue never
decides to route: a woken waiter asks the policy again.

Each waiter for a slot is counted against its tenant (``waiting``, what
``core.admission.share_room`` reads); a request that the full queue makes room
for (``Queue.displaces``) takes the place of that tenant's newest waiter, which
raises ``DisplacedError``. A request held for KV room (``tenant=None``) is counted
against nobody and never displaced: it is placed when its hold ends.
"""

from __future__ import annotations

import asyncio
from collections import deque

from kvgate.types import Priority

_LEVELS = len(Priority)


class DisplacedError(Exception):
    """A waiter's place went to another tenant's request (``core.admission.share_room``)."""


class _Waiter:
    """One request waiting: its future, and the tenant it is counted against."""

    __slots__ = ("fut", "tenant")

    def __init__(self, fut: asyncio.Future[None], tenant: str | None) -> None:
        self.fut = fut
        self.tenant = tenant


class AdmissionQueue:
    """A bounded, priority-ordered set of waiters for one gateway (all models)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._waiters: dict[Priority, deque[_Waiter]] = {
            p: deque() for p in sorted(Priority, reverse=True)
        }
        self._size = 0
        self.waiting: dict[str, list[int]] = {}
        """Per tenant, its waiters for a slot by priority (``core.admission.Waiting``);
        a tenant with none is dropped, so this holds only the tenants waiting now."""

    def __len__(self) -> int:
        return self._size

    @property
    def full(self) -> bool:
        """True when no more requests may wait."""
        return self._size >= self.capacity

    async def wait(
        self,
        priority: Priority,
        max_wait_s: float,
        tenant: str | None = None,
        displaces: tuple[str, Priority] | None = None,
    ) -> bool:
        """Wait until woken (True) or until ``max_wait_s`` passes (False).

        ``tenant``: whom a wait for a slot counts against (``None``: a KV hold, counted
        against nobody). ``displaces``: whose newest waiter at that priority gives up its
        place first (it raises ``DisplacedError``). Raises ``DisplacedError`` if this
        waiter's place goes to another tenant's request.
        """
        if displaces is not None:
            self._displace(*displaces)
        if max_wait_s <= 0 or self.full:
            return False
        waiter = _Waiter(asyncio.get_running_loop().create_future(), tenant)
        queue = self._waiters[priority]
        queue.append(waiter)
        self._size += 1
        if tenant is not None:
            counts = self.waiting.get(tenant)
            if counts is None:
                counts = self.waiting[tenant] = [0] * _LEVELS
            counts[priority] += 1
        try:
            async with asyncio.timeout(max_wait_s):
                await waiter.fut
            return True
        except TimeoutError:
            return False
        finally:
            if not waiter.fut.done():
                waiter.fut.cancel()
            try:
                queue.remove(waiter)
            except ValueError:
                pass  # woken or displaced: already taken out
            else:
                self._taken(waiter, priority)

    def _taken(self, waiter: _Waiter, priority: Priority) -> None:
        """``waiter`` left its queue: it no longer counts."""
        self._size -= 1
        tenant = waiter.tenant
        if tenant is not None:
            counts = self.waiting[tenant]
            counts[priority] -= 1
            if not any(counts):
                del self.waiting[tenant]

    def _displace(self, tenant: str, priority: Priority) -> None:
        """Refuse ``tenant``'s newest waiter at ``priority`` (``DisplacedError``)."""
        queue = self._waiters[priority]
        for i in range(len(queue) - 1, -1, -1):
            waiter = queue[i]
            if waiter.tenant == tenant and not waiter.fut.done():
                del queue[i]
                self._taken(waiter, priority)
                waiter.fut.set_exception(DisplacedError())
                return

    def wake_one(self) -> None:
        """A slot freed up: let the most important, oldest waiter try again."""
        if not self._size:
            return
        for priority, queue in self._waiters.items():
            while queue:
                waiter = queue.popleft()
                self._taken(waiter, priority)
                if not waiter.fut.done():
                    waiter.fut.set_result(None)
                    return

    def wake_all(self) -> None:
        """The fleet changed (a worker came back): every waiter tries again."""
        for priority, queue in self._waiters.items():
            while queue:
                waiter = queue.popleft()
                self._taken(waiter, priority)
                if not waiter.fut.done():
                    waiter.fut.set_result(None)
