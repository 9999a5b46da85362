"""The paged KV cache: chained block hashes and the GPU block pool.

Like vLLM's prefix caching, only full blocks are hashed, and a block's hash covers
every token before it, so two sequences share KV exactly as far as their hash
chains agree. The pool counts blocks rather than naming physical ones: hashed
blocks are reference-counted by hash, unhashed (private) blocks are a number.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from struct import Struct

import xxhash

from kvgate.types import BlockHash

_PACKERS: dict[int, Struct] = {}
"""``token_bytes``'s packers by token count (a prompt's length recurs: a conversation's
turns, a fleet's shared openings), started over past ``_MAX_PACKERS``."""
_MAX_PACKERS = 256


def token_bytes(tokens: Sequence[int]) -> bytes:
    """``tokens`` as native int64s, the bytes of ``array("q", tokens)``: a ``Struct`` of
    their count packs them at ~75 instructions a token where array's constructor parses
    each through ``PyArg_Parse`` at ~250 (a 4,096-token prompt 1.06M -> 0.31M)."""
    count = len(tokens)
    packer = _PACKERS.get(count)
    if packer is None:
        if len(_PACKERS) >= _MAX_PACKERS:
            _PACKERS.clear()
        packer = _PACKERS[count] = Struct(f"{count}q")
    return packer.pack(*tokens)


def whole_blocks(data: bytes, width: int) -> Iterable[bytes]:
    """The whole ``width``-byte blocks of ``data``, each its own ``bytes``, cut in C by
    ``Struct``s of up to ``_CHUNK`` ``{width}s`` (cached by count and width: at most
    ``_MAX_PACKERS``, ~8 KB each at most), where slicing them one by one in Python cost
    ~1.7k instructions a block against ~0.2k."""
    count = len(data) // width
    if count <= _CHUNK:
        return _splitter(count, width).unpack_from(data)
    full = count - count % _CHUNK
    chunks = _splitter(_CHUNK, width).iter_unpack(memoryview(data)[: full * width])
    tail = _splitter(count - full, width).unpack_from(data, full * width)
    return chain(chain.from_iterable(chunks), tail)


def _splitter(count: int, width: int) -> Struct:
    key = (count, width)
    splitter = _SPLITTERS.get(key)
    if splitter is None:
        if len(_SPLITTERS) >= _MAX_PACKERS:
            _SPLITTERS.clear()
        splitter = _SPLITTERS[key] = Struct(f"{width}s" * count)
    return splitter


_CHUNK = 256
"""Blocks a cached splitter cuts at once (4,096 tokens of 16; a longer prompt: rounds of it)."""
_SPLITTERS: dict[tuple[int, int], Struct] = {}
"""``whole_blocks``' splitters by (block count, width), started over past ``_MAX_PACKERS``."""


def chained(data: bytes, width: int, seed: int = 0) -> list[BlockHash]:
    """xxh3-64 of each whole ``width``-byte block of ``data``, each seeded with the hash
    before it (the first with ``seed``): each hash depends on the whole prefix."""
    digest = xxhash.xxh3_64_intdigest
    prev = seed
    return [prev := digest(block, prev) for block in whole_blocks(data, width)]


def chain_hashes(tokens: Sequence[int], block_size: int) -> list[BlockHash]:
    """Hashes of the full blocks of ``tokens``; block i's hash covers blocks 0..i (xxh3-64
    of block i's int64s seeded with block i-1's hash). 4,096 tokens in 16-token blocks:
    ~0.55M instructions (packing ~0.31M, hashing ~0.24M)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    return chained(token_bytes(tokens), block_size * 8)


class BlockPool:
    """GPU KV blocks: prefix-cached blocks by hash with reference counts, plus private blocks.

    A hashed block with reference count 0 stays cached but is *evictable*; evictable
    blocks are kept in least-recently-freed order and evicted oldest first when a
    block is needed. ``reserved`` counts blocks promised to admitted requests (used
    when preemption is off) that nobody else may take.
    """

    __slots__ = (
        "_evictable",
        "_on_evict",
        "capacity",
        "evictions",
        "journal",
        "private",
        "refs",
        "reserved",
    )

    def __init__(self, capacity: int, on_evict: Callable[[BlockHash], None] | None = None) -> None:
        self.capacity = capacity
        self.refs: dict[BlockHash, int] = {}
        self._evictable: OrderedDict[BlockHash, None] = OrderedDict()
        self.private = 0
        self.reserved = 0
        self.evictions = 0
        self._on_evict = on_evict
        self.journal: list[tuple[bool, BlockHash]] | None = None
        """When a list: every block that enters the cache ``(True, hash)`` or leaves it
        ``(False, hash)``, in order (what an engine publishes as KV events)."""

    @property
    def num_free(self) -> int:
        """Blocks holding nothing."""
        return self.capacity - len(self.refs) - self.private

    @property
    def num_evictable(self) -> int:
        """Cached blocks no request holds (they may be evicted)."""
        return len(self._evictable)

    @property
    def num_in_use(self) -> int:
        """Blocks held by at least one request."""
        return len(self.refs) - len(self._evictable) + self.private

    def available(self, own_reservation: int = 0) -> int:
        """Blocks a request holding ``own_reservation`` reserved blocks could obtain now."""
        return (
            self.capacity
            - len(self.refs)
            - self.private
            + len(self._evictable)
            - self.reserved
            + own_reservation
        )

    def evictable_hashes(self) -> list[BlockHash]:
        """Evictable block hashes, next to be evicted first."""
        return list(self._evictable)

    def match(self, hashes: Sequence[BlockHash], limit: int) -> int:
        """How many leading hashes of ``hashes[:limit]`` are cached on the GPU."""
        refs = self.refs
        n = 0
        while n < limit and hashes[n] in refs:
            n += 1
        return n

    def ref(self, block: BlockHash) -> None:
        """Take one more reference to a cached block (it stops being evictable)."""
        count = self.refs[block]
        if count == 0:
            del self._evictable[block]
        self.refs[block] = count + 1

    def make_room(self, blocks: int) -> None:
        """Evict least recently used blocks until ``blocks`` are free; the caller checked room."""
        missing = blocks - self.num_free
        if missing <= 0:
            return
        evictable = self._evictable
        refs = self.refs
        on_evict = self._on_evict
        journal = self.journal
        for _ in range(missing):
            block, _none = evictable.popitem(last=False)
            del refs[block]
            if on_evict is not None:
                on_evict(block)
            if journal is not None:
                journal.append((False, block))
        self.evictions += missing

    def insert(self, block: BlockHash) -> None:
        """Fill a free block with ``block`` and hold one reference to it."""
        if block in self.refs:
            # The same hash twice in one chain, or computed concurrently by another
            # request: share the cached copy; the block made free stays free.
            self.ref(block)
        else:
            self.refs[block] = 1
            if self.journal is not None:
                self.journal.append((True, block))

    def promote(self, block: BlockHash) -> None:
        """A held private block just became full with hash ``block``: cache it (or share)."""
        self.private -= 1
        self.insert(block)

    def release(self, blocks: Iterable[BlockHash]) -> None:
        """Drop one reference to each block; unreferenced blocks become evictable in order."""
        refs = self.refs
        evictable = self._evictable
        for block in blocks:
            count = refs[block] - 1
            refs[block] = count
            if count == 0:
                evictable[block] = None

    def discard(self, block: BlockHash) -> bool:
        """Remove an evictable block from the GPU (offload); False if absent or in use."""
        if self.refs.get(block) != 0:
            return False
        del self._evictable[block]
        del self.refs[block]
        if self.journal is not None:
            self.journal.append((False, block))
        return True

    def clear_evictable(self) -> int:
        """Forget every evictable block (as vLLM's ``reset_prefix_cache``); returns how many."""
        n = len(self._evictable)
        for block in self._evictable:
            del self.refs[block]
        if self.journal is not None:
            self.journal.extend((False, block) for block in self._evictable)
        self._evictable.clear()
        return n
