"""Writes that nobody waits for, coalesced: one Redis round trip for many requests.

``set_holders_soon`` is called once per request, after the request went to its
worker; only later requests read what it writes. On Redis a pipeline of its own
per request cost the gateway about as much CPU as the rest of the request
(redis-py builds, sends and parses each one in Python). Here writes wait in a map
(the last worker written for a block wins) for ``interval_s`` (10 ms) and while one
flush is in flight; the next flush takes everything that arrived meanwhile. At
3,000 requests a second one flush carries the writes of about 30 requests; a
replica reading them 10 ms later than it could is no loss (they are evidence of
what a worker caches, read by later requests).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

from kvgate.tasks import cancel_and_wait
from kvgate.types import BlockHash, Seconds, SessionKey, WorkerId

Batch = dict[BlockHash, tuple[WorkerId, int, str]]
"""block -> (worker, expiry in milliseconds, the tenant that wrote it)."""

MAX_PENDING = 200_000
"""Blocks waiting at most (a backend slower than the traffic drops the oldest)."""


class HolderWrites:
    """Coalesces holder writes into one ``write(batch)`` at a time."""

    def __init__(self, write: Callable[[Batch], Awaitable[None]], interval_s: float = 0.01) -> None:
        self._write = write
        self.interval_s = interval_s
        self._pending: Batch = {}
        self._failed: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self.flushes = 0
        """Batches written (tests, benchmarks: requests per flush)."""

    def add(
        self,
        entries: Sequence[tuple[BlockHash, WorkerId]],
        expire_ms: int,
        failed: Callable[[], None],
        tenant: str = "",
    ) -> None:
        """Queue ``entries`` (written by ``tenant``); ``failed`` is called (inside the
        ``except``) if their write raises."""
        pending = self._pending
        for block, worker in entries:
            pending.pop(block, None)  # re-inserted: the map stays oldest-first
            pending[block] = (worker, expire_ms, tenant)
        while len(pending) > MAX_PENDING:
            del pending[next(iter(pending))]
        if failed not in self._failed:
            self._failed.append(failed)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._pending:
                await asyncio.sleep(self.interval_s)  # let the writes of other requests join
                batch, self._pending = self._pending, {}
                failed, self._failed = self._failed, []
                self.flushes += 1
                try:
                    await self._write(batch)
                except Exception:
                    for callback in failed:
                        callback()
        finally:
            self._task = None

    async def close(self) -> None:
        """Drop what is pending and stop the flush in flight."""
        self._pending = {}
        task, self._task = self._task, None
        await cancel_and_wait(task)


class TouchThrottle:
    """When this replica last told Redis a session was active; a touch within
    ``interval_s`` of that need not go out again.

    A touch extends the binding's TTL (an hour by default) and orders the worker's
    sessions for migration: neither needs a round trip per request. Skipping them
    costs at most ``interval_s`` of TTL and of ordering. Bounded: the oldest are
    forgotten (their next touch goes out).
    """

    def __init__(self, interval_s: Seconds, max_keys: int = 100_000) -> None:
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._sent: OrderedDict[SessionKey, Seconds] = OrderedDict()

    def due(self, key: SessionKey, now: Seconds) -> bool:
        """True when a touch of ``key`` at ``now`` must go to Redis."""
        sent = self._sent.get(key)
        return sent is None or now - sent >= self.interval_s

    def sent(self, key: SessionKey, now: Seconds) -> None:
        """Redis extended ``key`` at ``now``."""
        self._sent.pop(key, None)
        self._sent[key] = now
        if len(self._sent) > self.max_keys:
            self._sent.popitem(last=False)
