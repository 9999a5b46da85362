"""The one async interface every affinity store backend implements.

An abstract base class rather than a protocol: a backend or a test double that
lacks a method fails when it is made, instead of the gateway quietly doing less
(no migrations, rollout state kept in one process, no close) when it is used.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from kvgate.core.decision import Affinity
from kvgate.store.health import StoreHealth
from kvgate.types import BlockHash, Seconds, SessionKey, WorkerId

_WRITING: set[asyncio.Task[None]] = set()
"""Writes in flight from ``set_holders_soon`` (the loop keeps only weak references)."""


class AffinityStore(ABC):
    """Affinity bindings, rollout blobs and leases, shared by whoever uses the store.

    Never raises because its backend is unwell: a backend that can fail (Redis)
    serves from a local fallback instead and says so through ``degraded`` and
    ``errors_total``, which the gateway exports as metrics.
    """

    @property
    @abstractmethod
    def degraded(self) -> bool:
        """True while the store serves from a local fallback instead of its backend."""
        ...

    @property
    @abstractmethod
    def errors_total(self) -> int:
        """Backend operations that failed since the store was opened."""
        ...

    def health(self) -> StoreHealth:
        """The counters the gateway exports (``kvgate_store_*``); a backend that can fail
        and recover (Redis) reports its outages, episodes, fallbacks and resyncs too."""
        return StoreHealth(errors_total=self.errors_total, degraded=self.degraded)

    @abstractmethod
    async def get(self, key: SessionKey) -> Affinity | None:
        """The live binding for ``key``, or ``None``."""
        ...

    @abstractmethod
    async def get_many(self, keys: Sequence[SessionKey]) -> list[Affinity | None]:
        """``get`` for many keys in one round trip, in the order given."""
        ...

    @abstractmethod
    async def get_holders(self, blocks: Sequence[BlockHash]) -> list[WorkerId | None]:
        """The worker each prefix block was last sent to, by any replica, in order.

        The shared prefix state of ``kvgate.core.holders``: how replicas agree on
        where a headerless conversation lives. One round trip.
        """
        ...

    @abstractmethod
    async def set_holders(
        self, entries: Sequence[tuple[BlockHash, WorkerId]], ttl: Seconds, tenant: str = ""
    ) -> None:
        """Record ``(block, worker)`` pairs for ``ttl`` seconds; the last writer wins.

        Counted against ``tenant`` (``RequestFeatures.tenant``, whose request sent the
        blocks): past its bound its own oldest go, never another tenant's (``holders``).
        """
        ...

    def set_holders_soon(
        self,
        entries: Sequence[tuple[BlockHash, WorkerId]],
        ttl: Seconds,
        failed: Callable[[], None],
        tenant: str = "",
    ) -> None:
        """``set_holders`` without waiting for it; ``failed`` is called (inside the
        ``except``, so it can log the error) if the write raises. Never raises itself.

        The request path calls it once the request is written to its worker: only
        later requests read what it writes, so neither the forwarding nor the answer
        should wait on a store round trip for it. This default runs the write as a
        task (readable once the store has it); an in-process store writes at once.
        """
        write = self._set_holders_or(entries, ttl, failed, tenant)
        task = asyncio.get_running_loop().create_task(write)
        _WRITING.add(task)
        task.add_done_callback(_WRITING.discard)

    async def _set_holders_or(
        self,
        entries: Sequence[tuple[BlockHash, WorkerId]],
        ttl: Seconds,
        failed: Callable[[], None],
        tenant: str,
    ) -> None:
        try:
            await self.set_holders(entries, ttl, tenant)
        except Exception:
            failed()

    @abstractmethod
    async def exchange_loads(self, replica: str, data: bytes, ttl: Seconds) -> dict[str, bytes]:
        """Publish ``data`` (``core.peers``: this replica's in-flight counts per worker) as
        ``replica``'s for ``ttl`` seconds, and return every live replica's, its own
        included: one round trip. A replica that stops publishing drops out at its TTL.
        """
        ...

    @abstractmethod
    async def set(self, affinity: Affinity, ttl: Seconds) -> None:
        """Bind ``affinity.session_key`` unconditionally for ``ttl`` seconds."""
        ...

    @abstractmethod
    async def compare_and_set(
        self, key: SessionKey, expected_worker: WorkerId | None, affinity: Affinity, ttl: Seconds
    ) -> Affinity:
        """Atomically bind ``key`` to ``affinity`` if it is unbound or bound to ``expected_worker``.

        Returns the binding in force afterwards: ``affinity`` if this call won, the
        binding another replica placed first otherwise. ``expected_worker=None``
        means "only if absent"; an absent binding matches any expectation.
        """
        ...

    @abstractmethod
    async def touch(self, key: SessionKey, now: Seconds, ttl: Seconds) -> bool:
        """Mark ``key`` active at ``now`` and extend its life by ``ttl``; False if unbound."""
        ...

    @abstractmethod
    async def delete(self, key: SessionKey) -> bool:
        """Forget ``key``'s binding; False if there was none."""
        ...

    @abstractmethod
    async def sessions_of(self, worker: WorkerId, limit: int | None = None) -> list[Affinity]:
        """Bindings to ``worker``, least recently active first (for draining and migration)."""
        ...

    @abstractmethod
    async def counts(self) -> dict[WorkerId, int]:
        """Live sessions per worker; workers with none are left out."""
        ...

    @abstractmethod
    async def get_blob(self, name: str) -> bytes | None:
        """A named opaque value (rollout state), or ``None``."""
        ...

    @abstractmethod
    async def put_blob(self, name: str, data: bytes) -> None:
        """Store a named opaque value; the last writer wins."""
        ...

    @abstractmethod
    async def acquire_lease(self, name: str, holder: str, ttl: Seconds) -> bool:
        """Take or renew the lease ``name`` for ``holder`` for ``ttl`` seconds.

        True if ``holder`` holds it afterwards. At most one holder at a time: this is
        how one gateway replica among many becomes the rollout controller.
        """
        ...

    @abstractmethod
    async def release_lease(self, name: str, holder: str) -> bool:
        """Give up the lease ``name`` if ``holder`` holds it; True if it did."""
        ...

    @abstractmethod
    async def close(self) -> None:
        """Release connections and background tasks; the store is unusable afterwards."""
        ...
