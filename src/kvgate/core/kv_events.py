"""KV cache events as engines publish them, and the order they must be applied in.

vLLM (``--kv-events-config``) and SGLang publish what their paged KV cache does:
``BlockStored`` (full blocks cached, with their hashes, the hash of the block before
the first, and their token ids), ``BlockRemoved`` (blocks evicted) and
``AllBlocksCleared`` (the prefix cache reset). Events come in batches, each with a
sequence number that rises by one per batch; a publisher keeps recent batches for
replay. These are the events as plain values (``kvgate.kvevents.wire`` decodes the
wire format into them), and ``Follower``: the pure rule that says, for each batch
received, whether to apply it, drop it as already seen, ask for a replay of a gap,
or start over because the publisher restarted.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

GPU_MEDIUM = "GPU"
"""The medium of blocks resident in GPU memory (``None`` on older engines means the same)."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks the engine cached, in chain order.

    ``token_ids`` holds ``block_size`` tokens per block; ``parent_block_hash`` is the
    engine's hash of the block before the first (``None``: the chain's first block).
    Engine hashes are opaque (vLLM's are seeded per process): the index keys blocks
    by their tokens instead (``core.exact_index``).
    """

    block_hashes: tuple[int | bytes, ...]
    parent_block_hash: int | bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks the engine evicted (or moved off ``medium``)."""

    block_hashes: tuple[int | bytes, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published batch: when, what, and from which data-parallel rank."""

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


class Offer(Enum):
    """What to do with a received batch (``Follower.offer``)."""

    APPLY = "apply"
    """The next one expected: apply it."""
    STALE = "stale"
    """Already applied (a replay overlapping live traffic): drop it."""
    GAP = "gap"
    """Batches are missing before it: replay from ``Follower.expected``, then apply it."""
    RESTART = "restart"
    """The publisher started over (its sequence went back): forget the worker's blocks,
    replay from 0, then apply it."""


class Follower:
    """The sequence numbers of one publisher, as a subscriber follows them.

    A fresh follower (or one after ``reset``) knows nothing: its first batch is a
    gap unless it is sequence 0, so a subscriber that starts late, or was
    restarted, replays the publisher's buffer from 0 before going on.

    A live batch numbered below the next expected one is either a duplicate (it
    was queued while a replay brought it) or a new publisher process counting
    from 0 again. Only a replay makes duplicates, and only of the range it
    brought: below that range (or with no replay since the last live batch) the
    publisher restarted, whether or not its sequence 0 was seen.
    """

    __slots__ = ("_replayed", "expected", "gaps", "restarts", "stale")

    def __init__(self) -> None:
        self.expected: int | None = None
        """The next sequence number to apply (``None``: nothing applied yet)."""
        self._replayed: int | None = None
        self.gaps = 0
        self.restarts = 0
        self.stale = 0

    def offer(self, seq: int) -> Offer:
        """Classify live batch ``seq`` (it is not applied until ``applied`` is told)."""
        expected = self.expected
        if expected is not None and seq < expected:
            low = self._replayed
            if low is not None and seq >= low:
                self.stale += 1
                return Offer.STALE
            self.restarts += 1
            self._replayed = None
            return Offer.RESTART
        self._replayed = None
        if seq == (expected if expected is not None else 0):
            return Offer.APPLY
        self.gaps += 1
        return Offer.GAP

    def replay_from(self) -> int:
        """The first sequence number a replay must bring."""
        return self.expected if self.expected is not None else 0

    def applied(self, seq: int) -> None:
        """Batch ``seq`` was applied (live or replayed)."""
        self.expected = seq + 1

    def replayed(self, start: int) -> None:
        """A replay from ``start`` was applied: live batches from there on are duplicates."""
        self._replayed = start

    def reset(self) -> None:
        """Forget the position (the subscriber restarted, or the publisher did)."""
        self.expected = None
        self._replayed = None
