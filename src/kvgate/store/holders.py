"""``HolderTable``: prefix block -> the worker some replica last sent it to, bounded.

The in-process half of the shared prefix state (``kvgate.core.holders``): what
``MemoryStore`` serves and the simulator reads in virtual time. Last writer wins;
entries expire after their TTL and the least recently written go first past
``max_entries``, so memory is bounded whatever the traffic (an entry costs about
150 bytes: ``max_entries`` 500,000 is about 75 MB).

The blocks are shared by design (a common opening's checkpoints name whichever worker
last got one, whoever sent it), but what is written is counted against the tenant whose
request wrote it (``RequestFeatures.tenant``), as sessions are (``store.table``): a tenant
past ``max_per_scope``, or holding its even share of a full table, makes room from its
own oldest, so one client's stream of ever-new prompts never evicts another's evidence.
With one tenant (the simulator) it is the LRU it always was.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvgate.types import BlockHash, Seconds, WorkerId


class HolderTable:
    """Block hash -> (worker, expiry, writer's tenant), with LRU-by-write eviction past
    ``max_entries`` and past ``max_per_scope`` of one tenant's (``None``: only its share)."""

    def __init__(self, max_entries: int = 500_000, max_per_scope: int | None = None) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        if max_per_scope is not None and max_per_scope < 1:
            raise ValueError("max_per_scope must be >= 1")
        self.max_entries = max_entries
        self.max_per_scope = max_per_scope
        self._entries: OrderedDict[BlockHash, tuple[WorkerId, Seconds, str]] = OrderedDict()
        self._by_tenant: dict[str, OrderedDict[BlockHash, None]] = {}
        self.evictions_total = 0

    def __len__(self) -> int:
        return len(self._entries)

    def held_by(self, tenant: str) -> int:
        """Entries tenant ``tenant`` wrote last (expired ones not yet swept included)."""
        own = self._by_tenant.get(tenant)
        return 0 if own is None else len(own)

    def get_many(self, blocks: Sequence[BlockHash], now: Seconds) -> list[WorkerId | None]:
        """The live holder of each block (``None`` if unknown or expired), in order."""
        entries = self._entries
        found: list[WorkerId | None] = []
        for block in blocks:
            entry = entries.get(block)
            if entry is None:
                found.append(None)
            elif entry[1] <= now:
                self._drop(block)
                found.append(None)
            else:
                found.append(entry[0])
        return found

    def set_many(
        self,
        entries: Sequence[tuple[BlockHash, WorkerId]],
        now: Seconds,
        ttl: Seconds,
        tenant: str = "",
    ) -> None:
        """Bind each block to its worker until ``now + ttl``, written by ``tenant``; the
        oldest go past the bounds (``tenant``'s own past its bound or its share)."""
        if not entries:
            return
        table = self._entries
        tenants = self._by_tenant
        own = tenants.get(tenant)
        if own is None:
            own = tenants[tenant] = OrderedDict()
        expires = now + ttl
        cap = self.max_per_scope
        for block, worker in entries:
            old = table.get(block)
            if old is not None and old[2] != tenant:
                self._disown(old[2], block)
            table[block] = (worker, expires, tenant)
            table.move_to_end(block)
            own[block] = None
            own.move_to_end(block)
            if cap is not None and len(own) > cap:
                self._drop(next(iter(own)))
                self.evictions_total += 1
        while len(table) > self.max_entries:
            # A full table: a tenant holding its even share or more makes room from its
            # own; any other takes the least recently written.
            if own and len(own) * len(tenants) >= self.max_entries:
                self._drop(next(iter(own)))
            else:
                self._drop(next(iter(table)))
            self.evictions_total += 1

    def _drop(self, block: BlockHash) -> None:
        _, _, tenant = self._entries.pop(block)
        self._disown(tenant, block)

    def _disown(self, tenant: str, block: BlockHash) -> None:
        own = self._by_tenant[tenant]
        del own[block]
        if not own:
            del self._by_tenant[tenant]
