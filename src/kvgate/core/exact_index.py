"""The exact index: which KV blocks each worker's engine says it holds (its KV events).

Where a worker publishes KV events (``core.kv_events``), the gateway need not infer
its cache from what it sent there: the engine says which blocks it stored and which
it evicted. Engine block hashes are opaque (vLLM seeds them per process, SGLang has
its own), so a block is keyed here by its tokens, as the engine keys it: the chain
hash of its ``block_size`` token ids seeded with the key of the block before it
(``engine.blocks.chain_hashes``, xxh3-64). A request's token ids chained the same way
find, per worker, how many of its leading blocks that worker holds: what the
approximate index (``core.prefix_index``) can only guess.

Bounds: each worker keeps at most ``max_worker_blocks`` entries and all workers
together ``max_total_blocks`` (an equal share each); past its bound a worker's
oldest stored blocks are dropped first (an engine's LRU evicts those first too, and
forgetting a block the engine still holds only under-claims). An entry (engine
hash, key, holder bit) takes about 175 bytes (tracemalloc, 100,000 entries), so the
default bound of two million entries is some 350 MB at most, far above a fleet's
real KV: a 64-worker fleet of 80 GB GPUs holds about 1.8 million 16-token blocks of
an 8B model.

Blocks stored under a LoRA adapter or on another medium than the GPU (an offload
tier) are not counted as held: a base-model request does not hit them, and an
offloaded block costs a transfer. Both are counted in ``ignored``.

Everything here is pure; the subscriber (``kvgate.kvevents``) and the simulator
feed it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field

from kvgate.core.kv_events import GPU_MEDIUM, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvgate.engine.blocks import chain_hashes, chained, token_bytes
from kvgate.types import BlockHash, WorkerId

EngineHash = int | bytes

_MASKS = 4096
"""Holder sets remembered with their workers (``ExactIndex._of_mask``) before starting over."""


class ExactIndexConfig(BaseModel):
    """Size bounds of the exact index.

    Example::

        exact_index:
          max_worker_blocks: 1048576
          max_total_blocks: 2000000
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_worker_blocks: int = Field(default=1 << 20, ge=1)
    max_total_blocks: int = Field(default=2_000_000, ge=1)


class _Worker:
    """One worker's blocks: engine hash -> key (in the order stored), key counts."""

    __slots__ = ("bit", "block_size", "held", "keys")

    def __init__(self, bit: int) -> None:
        self.bit = bit
        self.block_size = 0
        self.keys: dict[EngineHash, BlockHash] = {}
        self.held: dict[BlockHash, int] = {}


class ExactIndex:
    """Per-worker sets of blocks keyed by their tokens, from the engines' KV events."""

    def __init__(self, config: ExactIndexConfig | None = None) -> None:
        self.config = config if config is not None else ExactIndexConfig()
        self._workers: dict[WorkerId, _Worker] = {}
        self._by_bit: list[WorkerId | None] = []
        self._holders: dict[BlockHash, int] = {}
        # Holder bitmask -> its workers, as lookups met them (a fleet's chains end on
        # few distinct sets: every worker, a group's few), forgotten when a bit changes.
        self._masks: dict[int, tuple[WorkerId, ...]] = {}
        # The workers' block sizes (``held_token_groups``), made again when one changes.
        self._sizes: set[int] | None = None
        self.orphans = 0
        """Stored blocks whose parent the index did not know (events missed): not keyed."""
        self.ignored = 0
        """Stored blocks under a LoRA adapter or off the GPU: not counted as held."""
        self.trimmed = 0
        """Entries dropped to stay within the bounds."""

    # -- workers ----------------------------------------------------------------

    def track(self, worker: WorkerId) -> None:
        """``worker`` publishes events: from now on the index answers for it exactly."""
        if worker in self._workers:
            return
        try:
            bit = self._by_bit.index(None)
            self._by_bit[bit] = worker
        except ValueError:
            bit = len(self._by_bit)
            self._by_bit.append(worker)
        self._workers[worker] = _Worker(bit)
        self._masks.clear()
        self._sizes = None

    def tracks(self, worker: WorkerId) -> bool:
        """Whether the index answers for ``worker`` (it publishes events)."""
        return worker in self._workers

    def workers(self) -> Iterator[WorkerId]:
        """The workers the index answers for."""
        return iter(self._workers)

    def remove_worker(self, worker: WorkerId) -> None:
        """``worker`` left the fleet (or stopped publishing): forget it."""
        self.clear(worker)
        state = self._workers.pop(worker, None)
        if state is not None:
            self._by_bit[state.bit] = None
            self._masks.clear()
            self._sizes = None

    def blocks(self, worker: WorkerId) -> int:
        """Blocks ``worker`` holds by its events (its KV use between scrapes)."""
        state = self._workers.get(worker)
        return len(state.keys) if state is not None else 0

    def held_keys(self, worker: WorkerId) -> set[BlockHash]:
        """The token keys of every block ``worker`` holds."""
        state = self._workers.get(worker)
        return set(state.held) if state is not None else set()

    def block_size(self, worker: WorkerId) -> int:
        """Tokens per block of ``worker``'s engine (0: no block stored yet)."""
        state = self._workers.get(worker)
        return state.block_size if state is not None else 0

    def __len__(self) -> int:
        """Entries held over all workers (what the bounds count)."""
        return sum(len(state.keys) for state in self._workers.values())

    # -- events -----------------------------------------------------------------

    def apply(self, worker: WorkerId, events: Iterable[KVEvent]) -> None:
        """Apply one batch of ``worker``'s events, in order."""
        self.track(worker)
        for event in events:
            if isinstance(event, BlockStored):
                self._stored(worker, event)
            elif isinstance(event, BlockRemoved):
                if event.medium is None or event.medium == GPU_MEDIUM:
                    self.remove(worker, event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.clear(worker)

    def _stored(self, worker: WorkerId, event: BlockStored) -> None:
        size = event.block_size
        hashes = event.block_hashes
        if (
            event.lora_id is not None
            or (event.medium is not None and event.medium != GPU_MEDIUM)
            or size < 1
        ):
            self.ignored += len(hashes)
            return
        state = self._workers[worker]
        parent = event.parent_block_hash
        if parent is None:
            seed = 0
        else:
            known = state.keys.get(parent)
            if known is None:
                self.orphans += len(hashes)
                return
            seed = known
        # A malformed event (fewer tokens than blocks) keys the blocks its tokens fill.
        keys = chained(token_bytes(event.token_ids[: len(hashes) * size]), size * 8, seed)
        self.store(worker, hashes[: len(keys)], keys, size)

    def store(
        self,
        worker: WorkerId,
        engine_hashes: Sequence[EngineHash],
        keys: Sequence[BlockHash],
        block_size: int,
    ) -> None:
        """``worker`` holds these blocks (engine hashes with their token keys)."""
        self.track(worker)
        state = self._workers[worker]
        if state.block_size != block_size:
            state.block_size, self._sizes = block_size, None
        mask = 1 << state.bit
        holders, held, known = self._holders, state.held, state.keys
        for engine_hash, key in zip(engine_hashes, keys, strict=True):
            old = known.pop(engine_hash, None)
            if old is not None:
                self._drop(state, old, mask)
            known[engine_hash] = key
            count = held.get(key, 0)
            held[key] = count + 1
            if not count:
                holders[key] = holders.get(key, 0) | mask
        self._trim(state, mask)

    def remove(self, worker: WorkerId, engine_hashes: Iterable[EngineHash]) -> None:
        """``worker`` evicted these blocks (unknown ones are ignored)."""
        state = self._workers.get(worker)
        if state is None:
            return
        mask = 1 << state.bit
        known = state.keys
        for engine_hash in engine_hashes:
            key = known.pop(engine_hash, None)
            if key is not None:
                self._drop(state, key, mask)

    def clear(self, worker: WorkerId) -> None:
        """``worker`` holds nothing (its cache was reset, or the index lost track)."""
        state = self._workers.get(worker)
        if state is None:
            return
        keep = ~(1 << state.bit)
        holders = self._holders
        for key in state.held:
            remaining = holders.get(key, 0) & keep
            if remaining:
                holders[key] = remaining
            else:
                holders.pop(key, None)
        state.keys.clear()
        state.held.clear()

    def _drop(self, state: _Worker, key: BlockHash, mask: int) -> None:
        count = state.held[key] - 1
        if count:
            state.held[key] = count
            return
        del state.held[key]
        remaining = self._holders[key] & ~mask
        if remaining:
            self._holders[key] = remaining
        else:
            del self._holders[key]

    def _trim(self, state: _Worker, mask: int) -> None:
        cfg = self.config
        share = cfg.max_total_blocks // max(1, len(self._workers))
        cap = min(cfg.max_worker_blocks, max(1, share))
        known = state.keys
        while len(known) > cap:
            oldest = next(iter(known))
            self._drop(state, known.pop(oldest), mask)
            self.trimmed += 1

    # -- lookups ----------------------------------------------------------------

    def match(self, chain: Sequence[BlockHash]) -> dict[WorkerId, int]:
        """For every tracked worker holding the chain's first block: how many leading
        blocks it holds (``chain``: keys at that worker's block size)."""
        result: dict[WorkerId, int] = {}
        for depth, workers in self.match_groups(chain):
            result.update(dict.fromkeys(workers, depth))
        return result

    def match_groups(self, chain: Sequence[BlockHash]) -> list[tuple[int, tuple[WorkerId, ...]]]:
        """``match``'s answer by depth: ``(blocks held, the workers holding that many)``,
        each worker once, deepest last.

        Engines evict a chain's blocks tail first (vLLM frees a request's blocks last
        to first into its LRU queue, and a block in use holds its whole prefix in use;
        SGLang evicts radix-tree leaves), so what a worker holds of a chain is a
        prefix of it: whether every worker of a set holds block ``i`` is true up to
        some block and false after. The walk asks the chain's last block first (the
        deepest holders hold to the end), and bisects where the set still holding
        changes: ``1 + log n`` probes per depth held (a 4k-token prompt is 256 blocks
        of 16 tokens), not one per block. Workers are told by set, not one by one: a
        fleet whose 64 workers all hold a shared opening costs one entry, not 64.
        """
        n = len(chain)
        if not n:
            return []
        get = self._holders.get
        alive = get(chain[0], 0)
        groups: list[tuple[int, tuple[WorkerId, ...]]] = []
        last, end = 0, n - 1  # every worker in ``alive`` holds blocks 0..last
        while alive:
            if last == end or get(chain[end], 0) & alive == alive:
                groups.append((n, self._of_mask(alive)))
                break
            # Some worker of ``alive`` lacks block ``end``: bisect for the first such block.
            high = end
            while high - last > 1:
                mid = (last + high) >> 1
                if get(chain[mid], 0) & alive == alive:
                    last = mid
                else:
                    high = mid
            kept = alive & get(chain[high], 0)
            groups.append((high, self._of_mask(alive & ~kept)))
            alive, last = kept, high
        return groups

    def held_tokens(self, tokens: Sequence[int]) -> dict[WorkerId, int]:
        """For every tracked worker: leading tokens of ``tokens`` its cache holds."""
        result: dict[WorkerId, int] = {}
        for held, workers in self.held_token_groups(tokens):
            result.update(dict.fromkeys(workers, held))
        return result

    def held_token_groups(self, tokens: Sequence[int]) -> list[tuple[int, tuple[WorkerId, ...]]]:
        """``held_tokens`` by count (``match_groups``): ``(leading tokens held, the
        workers holding that many)``; the prompt is hashed once per block size."""
        states, sizes = self._workers, self._sizes
        if sizes is None:
            sizes = self._sizes = {s.block_size for s in states.values() if s.block_size}
        groups = []
        for size in sizes:
            for depth, holding in self.match_groups(chain_hashes(tokens, size)):
                workers = holding
                if len(sizes) > 1:
                    workers = tuple(w for w in holding if states[w].block_size == size)
                groups.append((depth * size, workers))
        return groups

    def depth(self, worker: WorkerId, chain: Sequence[BlockHash]) -> int:
        """Leading blocks of ``chain`` that ``worker`` holds."""
        state = self._workers.get(worker)
        if state is None:
            return 0
        held = state.held
        n = 0
        for key in chain:
            if key not in held:
                break
            n += 1
        return n

    def _of_mask(self, mask: int) -> tuple[WorkerId, ...]:
        """The tracked workers of a holder bitmask (remembered: masks recur)."""
        workers = self._masks.get(mask)
        if workers is not None:
            return workers
        by_bit, found, rest = self._by_bit, [], mask
        while rest:
            low = rest & -rest
            worker = by_bit[low.bit_length() - 1]
            if worker is not None:
                found.append(worker)
            rest ^= low
        if len(self._masks) >= _MASKS:
            self._masks.clear()
        workers = self._masks[mask] = tuple(found)
        return workers
