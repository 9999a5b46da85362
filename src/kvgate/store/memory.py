"""``MemoryStore``: the default, in-process affinity store.

Bounded (LRU eviction past ``max_sessions``; a tenant past ``max_per_scope`` or its even
share of a full table evicts its own), with TTLs read from an injected clock.
One gateway process needs nothing else; several replicas share a ``RedisStore``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from kvgate.core.decision import Affinity
from kvgate.store.base import AffinityStore
from kvgate.store.holders import HolderTable
from kvgate.store.loads import LoadTable
from kvgate.store.table import SessionTable
from kvgate.types import BlockHash, Seconds, SessionKey, WorkerId

Clock = Callable[[], float]


class MemoryStore(AffinityStore):
    """An ``AffinityStore`` held in this process's memory.

    ``clock`` gives the time TTLs are measured against (``time.monotonic`` unless a
    test or the simulator injects its own). ``touch``'s ``now`` is only recorded as
    the session's ``last_active``; expiry always follows ``clock``. Blobs and leases
    are few (named by the rollout controller), so they are not bounded.
    """

    def __init__(
        self,
        max_sessions: int = 1_000_000,
        clock: Clock = time.monotonic,
        expiry_granularity: Seconds = 1.0,
        max_holders: int = 500_000,
        *,
        max_per_scope: int | None = None,
        max_holders_per_scope: int | None = None,
    ) -> None:
        self.table = SessionTable(max_sessions, expiry_granularity, max_per_scope)
        self.holders = HolderTable(max_holders, max_holders_per_scope)
        self.loads = LoadTable()
        self.clock = clock
        self._blobs: dict[str, bytes] = {}
        self._leases: dict[str, tuple[str, Seconds]] = {}

    @property
    def degraded(self) -> bool:
        """Always False: memory cannot become unreachable."""
        return False

    @property
    def errors_total(self) -> int:
        """Always 0: there is no backend to fail."""
        return 0

    @property
    def evictions_total(self) -> int:
        """Sessions dropped to stay within ``max_sessions``."""
        return self.table.evictions_total

    def __len__(self) -> int:
        """Sessions held (expired ones not yet swept included)."""
        return len(self.table)

    async def get(self, key: SessionKey) -> Affinity | None:
        """The live binding for ``key``, or ``None``."""
        return self.table.get(key, self.clock())

    async def get_holders(self, blocks: Sequence[BlockHash]) -> list[WorkerId | None]:
        """The worker each prefix block was last sent to (``kvgate.core.holders``), in order."""
        return self.holders.get_many(blocks, self.clock())

    async def set_holders(
        self, entries: Sequence[tuple[BlockHash, WorkerId]], ttl: Seconds, tenant: str = ""
    ) -> None:
        """Record where prefix blocks were sent, for ``ttl`` seconds (last writer wins),
        counted against ``tenant``."""
        self.holders.set_many(entries, self.clock(), ttl, tenant)

    def set_holders_soon(
        self,
        entries: Sequence[tuple[BlockHash, WorkerId]],
        ttl: Seconds,
        failed: Callable[[], None],
        tenant: str = "",
    ) -> None:
        """``set_holders`` at once (readable when this returns): nothing to wait for in
        memory, so no coroutine or task; ``failed`` is never called."""
        self.holders.set_many(entries, self.clock(), ttl, tenant)

    async def exchange_loads(self, replica: str, data: bytes, ttl: Seconds) -> dict[str, bytes]:
        """Publish ``replica``'s in-flight counts for ``ttl`` seconds; every live replica's."""
        return self.loads.exchange(replica, data, self.clock(), ttl)

    async def get_many(self, keys: Sequence[SessionKey]) -> list[Affinity | None]:
        """``get`` for each key, in order."""
        t = self.clock()
        return [self.table.get(key, t) for key in keys]

    async def set(self, affinity: Affinity, ttl: Seconds) -> None:
        """Bind ``affinity.session_key`` unconditionally for ``ttl`` seconds."""
        t = self.clock()
        self.table.put(affinity, t + ttl, t)

    async def compare_and_set(
        self, key: SessionKey, expected_worker: WorkerId | None, affinity: Affinity, ttl: Seconds
    ) -> Affinity:
        """Bind ``key`` if unbound or bound to ``expected_worker``; the binding in force."""
        t = self.clock()
        return self.table.compare_and_set(key, expected_worker, affinity, t + ttl, t)

    async def touch(self, key: SessionKey, now: Seconds, ttl: Seconds) -> bool:
        """Record activity at ``now`` and extend the binding by ``ttl``; False if unbound."""
        t = self.clock()
        return self.table.touch(key, now, t + ttl, t)

    async def delete(self, key: SessionKey) -> bool:
        """Forget ``key``'s binding; False if there was none."""
        return self.table.delete(key, self.clock())

    async def sessions_of(self, worker: WorkerId, limit: int | None = None) -> list[Affinity]:
        """Live bindings to ``worker``, least recently active first."""
        return self.table.sessions_of(worker, self.clock(), limit)

    async def counts(self) -> dict[WorkerId, int]:
        """Live sessions per worker."""
        return self.table.counts(self.clock())

    async def get_blob(self, name: str) -> bytes | None:
        """A named opaque value, or ``None``."""
        return self._blobs.get(name)

    async def put_blob(self, name: str, data: bytes) -> None:
        """Store a named opaque value."""
        self._blobs[name] = bytes(data)

    async def acquire_lease(self, name: str, holder: str, ttl: Seconds) -> bool:
        """Take or renew lease ``name`` for ``holder``; False while someone else holds it."""
        t = self.clock()
        current = self._leases.get(name)
        if current is not None and current[0] != holder and current[1] > t:
            return False
        self._leases[name] = (holder, t + ttl)
        return True

    async def release_lease(self, name: str, holder: str) -> bool:
        """Give up lease ``name`` if ``holder`` holds it."""
        current = self._leases.get(name)
        if current is None or current[0] != holder or current[1] <= self.clock():
            return False
        del self._leases[name]
        return True

    def grant_lease(self, name: str, holder: str, ttl: Seconds) -> None:
        """Record ``holder`` as holding lease ``name`` (mirroring an authority elsewhere)."""
        self._leases[name] = (holder, self.clock() + ttl)

    def lease_holder(self, name: str) -> str | None:
        """Who holds lease ``name`` now, or ``None``."""
        current = self._leases.get(name)
        if current is None or current[1] <= self.clock():
            return None
        return current[0]

    async def close(self) -> None:
        """Forget everything."""
        self.table.clear()
        self._blobs.clear()
        self._leases.clear()
