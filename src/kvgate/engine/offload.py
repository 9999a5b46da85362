"""The offload tiers below the GPU: CPU memory, then disk, each LRU-bounded.

A block lives in one tier at most: the CPU tier or disk. It is usually off the GPU
too (moved there), unless it was copied (``Engine.offload(copy=True)``): then the GPU's
copy is used while it lasts, and the tier's once it is evicted. Putting a block in a
full CPU tier demotes the CPU tier's least recently used block to disk; a full disk tier
drops its oldest block.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from kvgate.types import BlockHash, Seconds


@dataclass(slots=True)
class OffloadTier:
    """One tier: a capacity in blocks, a transfer bandwidth, and its blocks in LRU order."""

    name: str
    capacity: int
    bandwidth_bytes_s: float
    blocks: OrderedDict[BlockHash, None] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self.blocks)


class OffloadStore:
    """CPU and disk tiers behind one interface: put, locate, take back."""

    __slots__ = ("bytes_per_block", "cpu", "disk", "dropped", "stored")

    def __init__(
        self,
        cpu_blocks: int,
        disk_blocks: int,
        cpu_bandwidth_bytes_s: float,
        disk_bandwidth_bytes_s: float,
        bytes_per_block: int,
    ) -> None:
        self.cpu = OffloadTier("cpu", cpu_blocks, cpu_bandwidth_bytes_s)
        self.disk = OffloadTier("disk", disk_blocks, disk_bandwidth_bytes_s)
        self.bytes_per_block = bytes_per_block
        self.stored = 0
        self.dropped = 0

    @property
    def enabled(self) -> bool:
        """True when either tier has capacity."""
        return self.cpu.capacity > 0 or self.disk.capacity > 0

    def __contains__(self, block: object) -> bool:
        return block in self.cpu.blocks or block in self.disk.blocks

    def __len__(self) -> int:
        return len(self.cpu.blocks) + len(self.disk.blocks)

    def put(self, block: BlockHash) -> Seconds | None:
        """Store ``block`` in the first tier with capacity; its copy time, or None if dropped.

        A block stored already is stored afresh (one copy: its place in the tier's LRU)."""
        self.disk.blocks.pop(block, None)
        for tier in (self.cpu, self.disk):
            if tier.capacity > 0:
                self._insert(tier, block)
                self.stored += 1
                return self.bytes_per_block / tier.bandwidth_bytes_s
        self.dropped += 1
        return None

    def _insert(self, tier: OffloadTier, block: BlockHash) -> None:
        blocks = tier.blocks
        blocks[block] = None
        blocks.move_to_end(block)
        if len(blocks) <= tier.capacity:
            return
        oldest, _none = blocks.popitem(last=False)
        if tier is self.cpu and self.disk.capacity > 0:
            self._insert(self.disk, oldest)
        else:
            self.dropped += 1

    def take(self, block: BlockHash) -> Seconds:
        """Remove ``block`` from its tier; the seconds to copy it back to the GPU."""
        for tier in (self.cpu, self.disk):
            if block in tier.blocks:
                del tier.blocks[block]
                return self.bytes_per_block / tier.bandwidth_bytes_s
        raise KeyError(block)

    def locate(self, block: BlockHash) -> str | None:
        """``"cpu"``, ``"disk"`` or None: where ``block`` is stored."""
        if block in self.cpu.blocks:
            return "cpu"
        if block in self.disk.blocks:
            return "disk"
        return None
