"""The emulated worker's KV events: its engine's block pool, published as vLLM does.

The engine journals every block that enters or leaves its GPU cache
(``Engine.record_kv_events``); after each engine step the journal becomes one
batch: runs of stored blocks that chain become a ``BlockStored`` (with the hash
of the block before the run and the run's token ids), evictions a
``BlockRemoved``. The engine knows blocks only by hash, so the worker remembers
each block's parent and tokens when it hashes a request (``BlockTokens``, bounded
above what the cache can hold).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from kvgate.core.kv_events import GPU_MEDIUM, BlockRemoved, BlockStored, EventBatch, KVEvent
from kvgate.engine import Engine
from kvgate.types import BlockHash


class BlockTokens:
    """Per block hash: the hash before it (0: none) and its tokens; bounded LRU."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._blocks: OrderedDict[BlockHash, tuple[BlockHash, tuple[int, ...]]] = OrderedDict()

    def note(self, tokens: Sequence[int], hashes: Sequence[BlockHash], block_size: int) -> None:
        """Remember the blocks of a chain (``hashes`` of ``tokens``' full blocks)."""
        blocks = self._blocks
        parent = 0
        for i, block in enumerate(hashes):
            if block in blocks:
                blocks.move_to_end(block)
            else:
                blocks[block] = (parent, tuple(tokens[i * block_size : (i + 1) * block_size]))
            parent = block
        while len(blocks) > self._limit:
            blocks.popitem(last=False)

    def get(self, block: BlockHash) -> tuple[BlockHash, tuple[int, ...]] | None:
        """The block's parent hash and tokens, if remembered."""
        return self._blocks.get(block)


def journal_events(
    journal: Sequence[tuple[bool, BlockHash]], tokens: BlockTokens, block_size: int
) -> list[KVEvent]:
    """The events of a journal (``Engine.drain_kv_events``), in order."""
    events: list[KVEvent] = []
    stored: list[BlockHash] = []
    stored_tokens: list[int] = []
    parent: BlockHash | None = None
    removed: list[BlockHash] = []

    def flush_stored() -> None:
        if stored:
            events.append(
                BlockStored(
                    tuple(stored), parent, tuple(stored_tokens), block_size, None, GPU_MEDIUM
                )
            )
            stored.clear()
            stored_tokens.clear()

    def flush_removed() -> None:
        if removed:
            events.append(BlockRemoved(tuple(removed), GPU_MEDIUM))
            removed.clear()

    for cached, block in journal:
        if not cached:
            flush_stored()
            removed.append(block)
            continue
        flush_removed()
        known = tokens.get(block)
        if known is None:
            continue  # hashed by no request this worker remembers (cannot happen in practice)
        before, block_tokens = known
        if not stored or before != stored[-1]:
            flush_stored()
            parent = before or None
        stored.append(block)
        stored_tokens.extend(block_tokens)
    flush_stored()
    flush_removed()
    return events


class EnginePublisher:
    """Turns the engine's journal into published batches (``publish`` per step)."""

    def __init__(
        self, engine: Engine, block_size: int, send: Callable[[EventBatch], object]
    ) -> None:
        engine.record_kv_events()
        self.engine = engine
        self.block_size = block_size
        self.tokens = BlockTokens(4 * engine.config.num_gpu_blocks + 65_536)
        self._send = send

    def publish(self) -> None:
        """Publish what the engine's cache did since the last call (nothing: no batch)."""
        journal = self.engine.drain_kv_events()
        if not journal:
            return
        events = journal_events(journal, self.tokens, self.block_size)
        if events:
            self._send(EventBatch(time.time(), tuple(events)))
