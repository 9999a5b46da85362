"""The other gateway replicas' in-flight counts, exchanged through the store (``core.peers``).

Every ``every_s`` (``LOADS_EVERY_S``: 100 ms) this replica publishes what it has in
flight on each worker and reads every live replica's, in one store round trip
(``AffinityStore.exchange_loads``: one script on Redis), and each worker's routed state
takes the others' sum (``WorkerPool.peered``): the snapshots routing reads count the
whole fleet's requests in flight, at most a period old. A replica that stops
(crashed, partitioned) stops publishing and drops out at its TTL; while Redis is
unreachable the store answers with this replica's own counts alone, so it routes on
them as before. Where the others' counts fell, held requests ask again (their KV may
fit now), as after a release of our own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket

from kvgate.core.peers import LOADS_EVERY_S, LOADS_TTL_S, counts_of, encode, others
from kvgate.gateway.observe.pool import WorkerPool
from kvgate.store.base import AffinityStore
from kvgate.tasks import cancel_and_wait
from kvgate.types import Seconds

log = logging.getLogger("kvgate.gateway.control.peers")


def replica_name() -> str:
    """A name no other replica has: host, process and a random part (a restarted
    process is a new replica; its old counts expire with their TTL)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class PeerLoads:
    """Publishes this replica's in-flight counts and applies the others' (module docs)."""

    def __init__(
        self,
        pool: WorkerPool,
        store: AffinityStore,
        *,
        replica: str | None = None,
        every_s: Seconds = LOADS_EVERY_S,
        ttl_s: Seconds = LOADS_TTL_S,
    ) -> None:
        self.pool = pool
        self.store = store
        self.replica = replica if replica is not None else replica_name()
        self.every_s = every_s
        self.ttl_s = ttl_s
        self.peers = 0
        """Other replicas seen at the last exchange."""
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    async def exchange(self) -> None:
        """One round: publish ours, take the others' sum per worker."""
        pool = self.pool
        own = counts_of((w.id, w.in_flight, w.kv_in_flight_tokens) for w in pool)
        published = await self.store.exchange_loads(self.replica, encode(own), self.ttl_s)
        theirs = others(published, self.replica)
        self.peers = len(published) - (self.replica in published)
        fell = False
        for worker in pool:
            fell |= pool.peered(worker, *theirs.get(worker.id, (0, 0)))
        if fell:
            pool.changed()

    def start(self) -> None:
        """Exchange every ``every_s`` in the background until ``stop``."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.exchange()
                self._failing = False
            except Exception:  # the store never raises by contract; a bug must not stop it
                if not self._failing:
                    log.exception("exchanging in-flight counts with the other replicas failed")
                self._failing = True
            await asyncio.sleep(self.every_s)

    async def stop(self) -> None:
        """Stop exchanging; the others drop this replica's counts at their TTL."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
