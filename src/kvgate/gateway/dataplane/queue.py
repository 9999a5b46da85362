"""The admission queue: where requests wait, bounded, for a worker to free up.

Waiters are woken highest priority first whenever a request finishes or a worker
becomes routable; within a priority, the tenants waiting take turns (round robin,
in the order each began waiting), and each tenant's own waiters go oldest first.
With one tenant that is oldest first. The queue never decides to route: a woken
waiter asks the policy again.

Each waiter for a slot is counted against its tenant (``waiting``, what
``core.admission.share_room`` reads); a request that the full queue makes room
for (``Queue.displaces``) takes the place of that tenant's newest waiter, which
raises ``DisplacedError``. A request held for KV room (``hold``) takes its turn
with its tenant's but is counted against nobody and never displaced: it is placed
when its hold ends.
"""

from __future__ import annotations

import asyncio
from collections import deque

from kvgate.types import Priority

_LEVELS = len(Priority)


class DisplacedError(Exception):
    """A waiter's place went to another tenant's request (``core.admission.share_room``)."""


class _Waiter:
    """One request waiting: its future, its tenant, and whether it counts against it."""

    __slots__ = ("counted", "fut", "tenant")

    def __init__(self, fut: asyncio.Future[None], tenant: str, counted: bool) -> None:
        self.fut = fut
        self.tenant = tenant
        self.counted = counted


class AdmissionQueue:
    """A bounded, priority-ordered set of waiters for one gateway (all models)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._turns: dict[Priority, dict[str, deque[_Waiter]]] = {
            p: {} for p in sorted(Priority, reverse=True)
        }
        """Per priority, most important first: each waiting tenant's waiters, oldest first;
        the tenants in the order of their turns (the next to be woken first)."""
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
        tenant: str = "",
        *,
        displaces: tuple[str, Priority] | None = None,
        hold: bool = False,
    ) -> bool:
        """Wait until woken (True) or until ``max_wait_s`` passes (False).

        ``tenant``: whose turn it waits in, and whom a wait for a slot counts against
        (a KV ``hold`` counts against nobody). ``displaces``: whose newest waiter at
        that priority gives up its place first (it raises ``DisplacedError``). Raises
        ``DisplacedError`` if this waiter's place goes to another tenant's request.
        """
        if displaces is not None:
            self._displace(*displaces)
        if max_wait_s <= 0 or self.full:
            return False
        waiter = _Waiter(asyncio.get_running_loop().create_future(), tenant, not hold)
        turns = self._turns[priority]
        own = turns.get(tenant)
        if own is None:
            own = turns[tenant] = deque()  # its turn comes after those waiting already
        own.append(waiter)
        self._size += 1
        if not hold:
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
                own.remove(waiter)
            except ValueError:
                pass  # woken or displaced: already taken out
            else:
                if not own and turns.get(tenant) is own:
                    del turns[tenant]
                self._taken(waiter, priority)

    def _taken(self, waiter: _Waiter, priority: Priority) -> None:
        """``waiter`` left the queue: it no longer counts."""
        self._size -= 1
        if waiter.counted:
            counts = self.waiting[waiter.tenant]
            counts[priority] -= 1
            if not any(counts):
                del self.waiting[waiter.tenant]

    def _displace(self, tenant: str, priority: Priority) -> None:
        """Refuse ``tenant``'s newest waiter for a slot at ``priority`` (``DisplacedError``)."""
        turns = self._turns[priority]
        own = turns.get(tenant)
        if own is None:
            return
        for i in range(len(own) - 1, -1, -1):
            waiter = own[i]
            if waiter.counted and not waiter.fut.done():
                del own[i]
                if not own:
                    del turns[tenant]
                self._taken(waiter, priority)
                waiter.fut.set_exception(DisplacedError())
                return

    def _next(self) -> tuple[_Waiter, Priority] | None:
        """Take out the waiter whose turn is next: the most important priority's next
        tenant's oldest; that tenant's turn comes again after the others'."""
        for priority, turns in self._turns.items():
            if turns:
                tenant, own = next(iter(turns.items()))
                waiter = own.popleft()
                del turns[tenant]
                if own:
                    turns[tenant] = own  # to the back of the line of turns
                self._taken(waiter, priority)
                return waiter, priority
        return None

    def wake_one(self) -> None:
        """A slot freed up: let the waiter whose turn it is try again."""
        while self._size:
            taken = self._next()
            if taken is None:
                return
            fut = taken[0].fut
            if not fut.done():
                fut.set_result(None)
                return

    def wake_all(self) -> None:
        """The fleet changed (a worker came back): every waiter tries again, in turn."""
        while (taken := self._next()) is not None:
            fut = taken[0].fut
            if not fut.done():
                fut.set_result(None)
