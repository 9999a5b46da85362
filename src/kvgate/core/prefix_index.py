"""A bounded, approximate index of which prefix blocks each worker holds.

Built only from the gateway's own routing history (no worker telemetry), it
remembers, per worker, the block hashes recently sent there, in LRU order, and
forgets roughly when the worker's KV cache would:

- each worker holds at most ``kv_capacity_tokens / tokens_per_block`` blocks when
  the worker's KV capacity is known, else ``default_worker_blocks``; blocks are
  counted in fine-block units, so a coarse block (past the chain's first
  ``fine_blocks``, ``coarse_factor`` times wider) weighs ``coarse_factor``;
- all workers together hold at most ``max_total_blocks`` (each worker gets an
  equal share of that), so memory is bounded whatever the traffic;
- the worker's own ``cached_tokens`` reports correct it: when a worker reports
  far fewer cached tokens than the index predicted, it is evicting sooner than
  its KV capacity suggests (running requests' decode blocks take the room), so
  its share shrinks multiplicatively; each confirmed prediction grows it back a
  little (AIMD). The request's own blocks are kept: the worker has just computed
  them, and they are its most recently used.

Chains are inserted last block first, so a chain's leading blocks are the most
recently used and its tail is forgotten first, as engines evict.

Lookups cost one dictionary probe per block: a block hash maps to a bitmask of
the workers holding it, and the walk intersects masks along the chain.

Memory: an entry costs about 200 bytes (a slot in the worker's ordered dict and
one in the shared holder map; measured by ``benchmarks/decision_bench.py``), so
the default bound of 500,000 entries is about 100 MB however many workers, and
a worker with 500k tokens of KV in 64-token blocks about 1.6 MB.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, KeysView, Sequence
from itertools import compress
from typing import cast

from pydantic import BaseModel, ConfigDict, Field

from kvgate.types import BlockHash, WorkerId

_DIGITS = bytes.maketrans(b"01", b"\x00\x01")
"""A mask's binary digits (``bin``) to the bytes 0 and 1: ``compress``'s selectors."""

_NAMED = 1024
"""The most holder masks whose workers ``PrefixIndex._record`` keeps named (then it starts
over)."""


class PrefixIndexConfig(BaseModel):
    """Size bounds and feedback rates of the prefix index.

    Example::

        index:
          block_chars: 256          # must equal features.block_chars
          default_worker_blocks: 4096
          max_total_blocks: 500000
          fine_blocks: 64           # = features.max_blocks
          coarse_factor: 16         # = features.coarse_factor
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    block_chars: int = Field(default=256, ge=1)
    fine_blocks: int = Field(default=64, ge=1)
    coarse_factor: int = Field(default=16, ge=1)
    chars_per_token: float = Field(default=4.0, gt=0)
    default_worker_blocks: int = Field(default=4096, ge=1)
    min_worker_blocks: int = Field(default=16, ge=1)
    kv_overcommit: float = Field(default=2.0, ge=0.1)
    """The index remembers up to this multiple of a worker's KV capacity.

    Forgetting too late sends a request to a worker that has evicted its blocks,
    where it finds what it would find anywhere else (and the ``cached_tokens``
    feedback shrinks the share); forgetting too early sends it away from a cache
    that is still there. So err late: on issue 11's long-context trace an index
    sized at exactly the KV capacity moved 42 of 227 later turns off their
    worker (31.9% hit), at twice the capacity 19 (33.1%, of a 33.5% reference).
    """
    resident_turnover: float = Field(default=1.5, gt=0)
    """A claim is judged likely resident while less than this multiple of the worker's
    KV capacity was sent there after it (``PrefixIndex.resident_depth``).

    The engine's LRU evicts a block about one capacity later; the cut errs late,
    because an entry's age counts only what the index saw (not output blocks, nor
    what other replicas sent). The default policy counts the band between one
    capacity and this cut at the share usage confirms (``ClaimShares``): on issue
    11's shared-opening trace claims aged 1.0-1.5 capacities mostly missed, and
    counting them in full hid their 10-20k-token recomputes from the TTFT terms.
    """
    max_total_blocks: int = Field(default=500_000, ge=1)
    miss_tolerance: float = Field(default=0.5, ge=0, le=1)
    miss_decrease: float = Field(default=0.7, gt=0, le=1)
    hit_increase: float = Field(default=0.02, ge=0, le=1)
    min_scale: float = Field(default=0.05, gt=0, le=1)
    max_pending: int = Field(default=65_536, ge=1)


class PrefixIndex:
    """Per-worker LRU sets of block hashes with a global bound (see module docs)."""

    def __init__(self, config: PrefixIndexConfig | None = None) -> None:
        self.config = config if config is not None else PrefixIndexConfig()
        self._holders: dict[BlockHash, int] = {}
        self._lru: dict[WorkerId, OrderedDict[BlockHash, int]] = {}
        self.worker_changes = 0
        """Bumped whenever a worker joins or leaves ``known_workers`` (a cache's key)."""
        self._weight: dict[WorkerId, int] = {}
        self._bit: dict[WorkerId, int] = {}
        self._by_bit: list[WorkerId | None] = []
        # A holder mask's workers at a depth, as ``match`` answers them (``_record``): the
        # same few masks (a shared prompt's holders) come back on request after request.
        self._named: dict[tuple[int, int], dict[WorkerId, int]] = {}
        self._base: dict[WorkerId, int] = {}
        # Per worker whose KV capacity is known, that capacity in index blocks: the
        # engine's LRU turns over at it whatever the index's miss feedback (``_scale``).
        self._kv: dict[WorkerId, float] = {}
        self._scale: dict[WorkerId, float] = {}
        # Per worker, the weight of blocks ever added there: an entry's stamp is this
        # clock when it was last sent, so ``clock - stamp`` is how much was added since.
        self._clock: dict[WorkerId, int] = {}
        # An entry's value packs its stamp and its weight: ``stamp * _unit + weight``.
        self._unit = self.config.coarse_factor + 1
        cfg = self.config
        # ``capacity`` runs some five times a request under the default policy: its
        # bounds are read once here (a pydantic attribute costs twice a plain one).
        self._bounds = (cfg.default_worker_blocks, cfg.min_worker_blocks, cfg.max_total_blocks)
        self._pending: OrderedDict[str, tuple[WorkerId, int]] = OrderedDict()

    # -- sizes ---------------------------------------------------------------

    def __len__(self) -> int:
        """Block entries held over all workers (what the memory bound counts)."""
        return sum(len(lru) for lru in self._lru.values())

    def known_workers(self) -> KeysView[WorkerId]:
        """Workers the index currently knows, as a set."""
        return self._lru.keys()

    def workers(self) -> Iterator[WorkerId]:
        """Workers the index currently knows."""
        return iter(self._lru)

    def worker_blocks(self, worker: WorkerId) -> int:
        """Block entries held for ``worker``."""
        lru = self._lru.get(worker)
        return len(lru) if lru is not None else 0

    def worker_weight(self, worker: WorkerId) -> int:
        """What ``worker``'s entries weigh, in fine blocks (what its capacity bounds)."""
        return self._weight.get(worker, 0)

    def fill(self, worker: WorkerId, most: float = 1.0) -> float:
        """How full ``worker``'s KV cache is with its recent chains (0 to ``most``, at most
        ``kv_overcommit``: the cache's size times over).

        The share remembers ``kv_overcommit`` times the KV capacity, so a worker
        whose recent chains just fill its cache reads 1 (not ``1 / kv_overcommit``,
        as the share's own fullness would): from there on every new block there
        evicts one that a returning request asks for, and past 1 the share says how many
        times over it is asked for.
        """
        weight = self._weight.get(worker, 0)
        if not weight:
            return 0.0
        fill = self.config.kv_overcommit * weight / self.capacity(worker)
        return fill if fill < most else most

    def depth_chars(self, depth: int) -> int:
        """Characters covered by the first ``depth`` blocks of a chain."""
        cfg = self.config
        fine = cfg.fine_blocks
        if depth <= fine:
            return depth * cfg.block_chars
        return (fine + (depth - fine) * cfg.coarse_factor) * cfg.block_chars

    def depth_for_chars(self, chars: int) -> int:
        """The fewest leading blocks of a chain that cover ``chars`` characters."""
        cfg = self.config
        fine, size = cfg.fine_blocks, cfg.block_chars
        if chars <= fine * size:
            return -(-chars // size) if chars > 0 else 0
        return fine + -(-(chars - fine * size) // (cfg.coarse_factor * size))

    def depth_within(self, chars: int) -> int:
        """The most leading blocks of a chain that ``chars`` characters cover whole."""
        cfg = self.config
        fine, size = cfg.fine_blocks, cfg.block_chars
        if chars <= fine * size:
            return max(chars, 0) // size
        return fine + (chars - fine * size) // (cfg.coarse_factor * size)

    def distinct_blocks(self) -> int:
        """Distinct block hashes held by at least one worker."""
        return len(self._holders)

    def capacity(self, worker: WorkerId) -> int:
        """The most blocks the index keeps for ``worker`` right now."""
        default, least, total = self._bounds
        # Conditionals, not ``min``/``max``: on 3.11 each call parses keyword arguments
        # (~750 instructions); this runs some five times a request.
        scaled = int(self._base.get(worker, default) * self._scale.get(worker, 1.0))
        scaled = scaled if scaled > least else least
        workers = len(self._lru)
        share = total // workers if workers > 1 else total
        share = share if share > 1 else 1
        return scaled if scaled < share else share

    def kv_blocks(self, worker: WorkerId) -> float:
        """``worker``'s KV capacity in index blocks: the new weight after which its LRU
        has likely evicted an entry. Known, it is the engine's, whatever the index's miss
        feedback: a miss says the index claimed too much, not that the cache is smaller,
        and cutting the age window with it judged resident caches gone (on issue 11's
        trace, continuations moved off a worker still holding 6-15k of their tokens).
        Unknown, the index's own capacity (feedback included) stands in for it."""
        known = self._kv.get(worker)
        if known is not None:
            return known
        return self.capacity(worker) / self.config.kv_overcommit

    def set_kv_capacity(self, worker: WorkerId, kv_capacity_tokens: int | None) -> None:
        """Size ``worker``'s share from its KV capacity in tokens (``None``: unknown)."""
        if kv_capacity_tokens is None or kv_capacity_tokens <= 0:
            blocks = self.config.default_worker_blocks
            self._kv.pop(worker, None)
        else:
            tokens_per_block = self.config.block_chars / self.config.chars_per_token
            blocks = max(1, int(self.config.kv_overcommit * kv_capacity_tokens / tokens_per_block))
            self._kv[worker] = kv_capacity_tokens / tokens_per_block
        if self._base.get(worker) != blocks:
            self._base[worker] = blocks
            if worker in self._lru:
                self._trim(worker)

    # -- learning ------------------------------------------------------------

    def insert(self, worker: WorkerId, hashes: Sequence[BlockHash]) -> None:
        """Record that ``worker`` was sent a request with this chain."""
        if not hashes:
            return
        lru = self._lru.get(worker)
        if lru is None:
            lru = self._add_worker(worker)
        mask = 1 << self._bit[worker]
        holders = self._holders
        fine = self.config.fine_blocks
        coarse = self.config.coarse_factor
        unit = self._unit
        clock = self._clock[worker]
        added = 0
        # Past a KV capacity's worth of newer blocks, the engine's LRU has likely
        # evicted an entry: sent again, it is computed and allocated anew, so it
        # ages every entry behind it as a new block would (``resident_depth``).
        turnover = self.kv_blocks(worker)
        for i in range(len(hashes) - 1, -1, -1):
            h = hashes[i]
            old = lru.pop(h, None)
            if old is not None:
                if clock - old // unit > turnover:
                    clock += old % unit
                lru[h] = clock * unit + old % unit
            else:
                weight = 1 if i < fine else coarse
                clock += weight
                lru[h] = clock * unit + weight
                added += weight
                holders[h] = holders.get(h, 0) | mask
        self._clock[worker] = clock
        self._weight[worker] += added
        self._trim(worker)

    def note_routed(self, request_id: str, worker: WorkerId, hashes: Sequence[BlockHash]) -> None:
        """Remember what the index predicted for ``worker``, then insert the chain."""
        predicted = self.match_worker(hashes, worker)
        pending = self._pending
        pending[request_id] = (worker, predicted)
        if len(pending) > self.config.max_pending:
            pending.popitem(last=False)
        self.insert(worker, hashes)

    def unclaimed(self, request_id: str) -> None:
        """``request_id`` went where the index's claim does not hold (a cold slot of an
        engine of slots): its usage has nothing to judge (``note_usage``)."""
        self._pending.pop(request_id, None)

    def note_usage(
        self,
        request_id: str,
        worker: WorkerId,
        prompt_chars: int,
        prompt_tokens: int,
        cached_tokens: int,
    ) -> bool | None:
        """Correct ``worker``'s share by its reported ``cached_tokens``.

        Returns True when the prediction held, False when it was a miss (the share
        shrank), ``None`` when there was nothing to judge.
        """
        entry = self._pending.pop(request_id, None)
        if entry is None or entry[0] != worker or entry[1] <= 0 or worker not in self._lru:
            return None
        cfg = self.config
        predicted_chars = self.depth_chars(entry[1])
        if 0 < prompt_chars < predicted_chars:
            # The trailing block may be partial; never predict more than the prompt.
            predicted_chars = prompt_chars
        if prompt_tokens > 0 and prompt_chars > 0:
            reported_chars = cached_tokens * prompt_chars / prompt_tokens
        else:
            reported_chars = cached_tokens * cfg.chars_per_token
        scale = self._scale.get(worker, 1.0)
        if reported_chars < predicted_chars * (1.0 - cfg.miss_tolerance):
            self._scale[worker] = max(cfg.min_scale, scale * cfg.miss_decrease)
            self._trim(worker)
            return False
        scale += cfg.hit_increase
        self._scale[worker] = scale if scale < 1.0 else 1.0
        return True

    def remove_worker(self, worker: WorkerId) -> None:
        """Forget everything about ``worker``."""
        lru = self._lru.pop(worker, None)
        self.worker_changes += 1
        self._weight.pop(worker, None)
        self._base.pop(worker, None)
        self._kv.pop(worker, None)
        self._scale.pop(worker, None)
        self._clock.pop(worker, None)
        if lru is None:
            return
        bit = self._bit.pop(worker)
        self._by_bit[bit] = None
        self._named.clear()
        keep = ~(1 << bit)
        holders = self._holders
        for h in lru:
            mask = holders[h] & keep
            if mask:
                holders[h] = mask
            else:
                del holders[h]

    # -- lookup --------------------------------------------------------------

    def match(self, hashes: Sequence[BlockHash], min_depth: int = 1) -> dict[WorkerId, int]:
        """For every worker holding at least ``min_depth`` leading blocks: how many it holds."""
        if not hashes:
            return {}
        holders = self._holders
        alive = holders.get(hashes[0], 0)
        result: dict[WorkerId, int] = {}
        if not alive:
            return result
        depth = 1
        for h in hashes[1:]:
            nxt = alive & holders.get(h, 0)
            if nxt != alive:
                if depth >= min_depth:
                    self._record(alive & ~nxt, depth, result)
                alive = nxt
                if not alive:
                    return result
            depth += 1
        self._record(alive, depth, result)
        return result

    def match_worker(self, hashes: Sequence[BlockHash], worker: WorkerId) -> int:
        """How many leading blocks of the chain ``worker`` holds."""
        lru = self._lru.get(worker)
        if lru is None:
            return 0
        depth = 0
        for h in hashes:
            if h not in lru:
                break
            depth += 1
        return depth

    def resident_depth(
        self,
        hashes: Sequence[BlockHash],
        worker: WorkerId,
        depth: int,
        turnover: float | None = None,
    ) -> int:
        """How many of the first ``depth`` blocks ``worker`` likely still has in its KV cache.

        The index remembers ``kv_overcommit`` times a worker's KV capacity, erring
        late so that placement does not leave a cache that is still there. But a
        block after which more than the KV capacity was sent to the worker has
        likely been evicted by the engine's LRU: a request that finds it gone
        recomputes it, and a queue estimate that counted it as cached is short by
        exactly the long prefills the tail latency is made of. The cut lies at
        ``resident_turnover`` capacities: an entry's age (new weight sent since)
        undercounts its LRU position a little, and on issue 11's trace a cut at the
        capacity itself judged 12 of 38 claims gone that then hit. An entry sent
        again after a capacity's worth of newer blocks ages the entries behind it
        as a new block would (``insert``): the engine had likely evicted it and
        computes it anew, and without that a recomputed stale claim kept the clock
        still while the engine's cache turned over.

        Every chain through a block runs through all the blocks before it, and is
        inserted back to front, so along a chain stamps never rise: being held and
        young is monotone, and a binary search finds the cut.
        """
        lru = self._lru.get(worker)
        depth = depth if depth < len(hashes) else len(hashes)
        if lru is None or depth <= 0:
            return 0
        if turnover is None:
            turnover = self.config.resident_turnover
        return self._held_since(
            lru, hashes, depth, self._clock[worker] - self.kv_blocks(worker) * turnover
        )

    def resident_cuts(
        self, hashes: Sequence[BlockHash], worker: WorkerId, depth: int, young: float
    ) -> tuple[int, int]:
        """Of the first ``depth`` blocks, how many are younger than ``young`` KV turnovers
        among those ``resident_depth`` judges resident, and how many that judges resident:
        a claim's two cuts with one look-up of the worker's window."""
        lru = self._lru.get(worker)
        depth = depth if depth < len(hashes) else len(hashes)
        if lru is None or depth <= 0:
            return 0, 0
        clock, blocks = self._clock[worker], self.kv_blocks(worker)
        resident = self._held_since(
            lru, hashes, depth, clock - blocks * self.config.resident_turnover
        )
        if resident <= 0:
            return 0, 0
        return self._held_since(lru, hashes, resident, clock - blocks * young), resident

    def _held_since(
        self, lru: dict[BlockHash, int], hashes: Sequence[BlockHash], depth: int, oldest: float
    ) -> int:
        """How many of the first ``depth`` (> 0) of ``hashes`` ``lru`` holds stamped at
        ``oldest`` or later (``resident_depth``: monotone along a chain)."""
        unit = self._unit
        value = lru.get(hashes[depth - 1])
        if value is not None and value // unit >= oldest:
            return depth
        low, high = 0, depth - 1  # blocks before ``low`` are resident; ``high`` is not
        while low < high:
            mid = (low + high) // 2
            value = lru.get(hashes[mid])
            if value is not None and value // unit >= oldest:
                low = mid + 1
            else:
                high = mid
        return low

    # -- internals -----------------------------------------------------------

    def _record(self, mask: int, depth: int, result: dict[WorkerId, int]) -> None:
        named = self._named.get((mask, depth))
        if named is None:
            # Masks are often dense (a shared system prompt is on every worker): the
            # workers of its set bits are picked out in C, its binary digits read as bytes
            # 0 and 1 (a set bit always names a worker: ``remove_worker`` clears it).
            bits = bin(mask)[:1:-1].encode().translate(_DIGITS)
            named = dict.fromkeys(cast("Iterator[WorkerId]", compress(self._by_bit, bits)), depth)
            if len(self._named) >= _NAMED:
                self._named.clear()
            self._named[mask, depth] = named
        result.update(named)  # a copy: ``named`` stays as it is

    def _add_worker(self, worker: WorkerId) -> OrderedDict[BlockHash, int]:
        try:
            bit = self._by_bit.index(None)
            self._by_bit[bit] = worker
            self._named.clear()
        except ValueError:
            bit = len(self._by_bit)
            self._by_bit.append(worker)
        self._bit[worker] = bit
        lru: OrderedDict[BlockHash, int] = OrderedDict()
        self._lru[worker] = lru
        self.worker_changes += 1
        self._weight[worker] = 0
        self._clock[worker] = 0
        # One more worker shrinks everyone's share of the global bound.
        for other in list(self._lru):
            if other != worker:
                self._trim(other)
        return lru

    def _trim(self, worker: WorkerId) -> None:
        lru = self._lru[worker]
        cap = self.capacity(worker)
        weight = self._weight[worker]
        if weight <= cap:
            return
        keep = ~(1 << self._bit[worker])
        holders = self._holders
        unit = self._unit
        while weight > cap and lru:
            h, value = lru.popitem(last=False)
            weight -= value % unit
            mask = holders[h] & keep
            if mask:
                holders[h] = mask
            else:
                del holders[h]
        self._weight[worker] = weight
