"""``HolderTable``: prefix block -> the worker some replica last sent it to, bounded.

The in-process half of the shared prefix state (``kvgate.core.holders``): what
``MemoryStore`` serves and the simulator reads in virtual time. Last writer wins;
entries expire after their TTL and the least recently written go first past
``max_entries``, so memory is bounded whatever the traffic (an entry costs about
150 bytes: ``max_entries`` 500,000 is about 75 MB).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvgate.types import BlockHash, Seconds, WorkerId


class HolderTable:
    """Block hash -> (worker, expiry), with LRU-by-write eviction past ``max_entries``."""

    def __init__(self, max_entries: int = 500_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[BlockHash, tuple[WorkerId, Seconds]] = OrderedDict()
        self.evictions_total = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get_many(self, blocks: Sequence[BlockHash], now: Seconds) -> list[WorkerId | None]:
        """The live holder of each block (``None`` if unknown or expired), in order."""
        entries = self._entries
        found: list[WorkerId | None] = []
        for block in blocks:
            entry = entries.get(block)
            if entry is None:
                found.append(None)
            elif entry[1] <= now:
                del entries[block]
                found.append(None)
            else:
                found.append(entry[0])
        return found

    def set_many(
        self, entries: Sequence[tuple[BlockHash, WorkerId]], now: Seconds, ttl: Seconds
    ) -> None:
        """Bind each block to its worker until ``now + ttl``; the oldest go past the bound."""
        table = self._entries
        expires = now + ttl
        for block, worker in entries:
            table[block] = (worker, expires)
            table.move_to_end(block)
        while len(table) > self.max_entries:
            table.popitem(last=False)
            self.evictions_total += 1
