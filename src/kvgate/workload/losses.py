"""Where a placement's hits were lost: a replay that puts every prompt token down to a cause.

A hit rate under the capacity-aware reference (``workload.bound``) says how much was
lost, not where. This replays a run's placements on one pinned pool per worker (as
``workload.pinned``: a request's chain pinned from its first token to its last, the
rest evicted least recently used first) and, when each request starts, puts each of
its prompt tokens down to one of:

- ``hit``: the leading blocks its pool holds;
- ``elsewhere``: past those, blocks another pool holds at that instant (the routing's
  loss: placed there, the request would have hit them);
- ``evicted_here``: blocks its own pool had cached before and evicted (the capacity's
  loss on the pool it was sent to);
- ``evicted_away``: blocks some earlier request produced, never on its pool, held on
  none now (cached elsewhere and evicted there);
- ``new``: blocks no earlier request produced, and the tokens the engine always
  computes (past the last whole block, the last prompt token): no placement hits them.

``place="reference"`` replays the capacity-aware reference itself (one pool of the
fleet's KV, every request instantaneous, in arrival order: ``hit``, ``evicted_here``,
``new`` only), ``place="one"`` one pinned pool of the fleet's KV on the run's timing.
``free_copies``: a block held by *k* pools costs each of them 1/*k* of a block, so a
prefix cached twice takes the room of one: what the run's placement would keep if
duplicates cost nothing. ``copies`` is the mean share of the fleet's KV that second
copies take, sampled as each request starts.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kvgate.workload.pinned import Span, events_of, unpin
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import SimRequest

CAUSES = ("hit", "elsewhere", "evicted_here", "evicted_away", "new")
"""What a prompt token is put down to, in report order (module docs)."""

Place = Literal["reference", "one", "run", "partition"]


@dataclass(frozen=True, slots=True)
class Losses:
    """A replay's prompt tokens by cause (``CAUSES``), and the share duplicates took."""

    prompt_tokens: int
    tokens: dict[str, int]
    copies: float = 0.0

    @property
    def hit_rate(self) -> float:
        """Prompt tokens hit, over prompt tokens."""
        return self.tokens["hit"] / self.prompt_tokens if self.prompt_tokens else 0.0

    def points(self) -> dict[str, float]:
        """Each cause in points of the prompt tokens."""
        total = self.prompt_tokens or 1
        return {cause: 100.0 * n / total for cause, n in self.tokens.items()}


class Pools:
    """Pinned LRU pools, one per worker, that know who else holds each block.

    A block's room is counted in ``unit`` parts: a whole ``unit`` for every holder, or
    with ``free_copies`` ``unit / k`` for each of its *k* holders (``unit`` divides by
    every *k*, so the sums stay exact)."""

    def __init__(self, capacities: Sequence[int], *, free_copies: bool = False) -> None:
        n = len(capacities)
        self.unit = math.lcm(*range(1, n + 1)) if free_copies else 1
        self.free_copies = free_copies
        self.capacity = [c * self.unit for c in capacities]
        self.free: list[OrderedDict[int, None]] = [OrderedDict() for _ in capacities]
        self.pinned: list[dict[int, int]] = [{} for _ in capacities]
        self.holders: dict[int, list[int]] = {}
        self.charge = [0] * n
        self.ever: list[set[int]] = [set() for _ in capacities]
        self.copies = 0  # blocks held, less distinct blocks held

    def holds(self, pool: int, chain: list[int], limit: int) -> int:
        """Leading blocks of ``chain`` (at most ``limit``) ``pool`` holds."""
        holders = self.holders
        hits = 0
        while hits < limit and pool in holders.get(chain[hits], ()):
            hits += 1
        return hits

    def start(self, pool: int, chain: list[int]) -> None:
        """A request starts on ``pool``: its chain is cached there and pinned."""
        pinned, free = self.pinned[pool], self.free[pool]
        for block in chain:
            if block in free:
                del free[block]
            elif block not in pinned:
                self._add(pool, block)
            pinned[block] = pinned.get(block, 0) + 1
        self._evict()

    def end(self, pool: int, chain: list[int], output: list[int]) -> None:
        """A request ends: its chain is released, tail first, its output cached beside it."""
        pinned, free, holders = self.pinned[pool], self.free[pool], self.holders
        unpin(pinned, chain)
        for block in reversed((*chain, *output)):
            if block in pinned:
                continue
            if pool not in holders.get(block, ()):
                self._add(pool, block)
            free[block] = None
            free.move_to_end(block)
        self._evict()

    def _add(self, pool: int, block: int) -> None:
        held = self.holders.setdefault(block, [])
        k, unit = len(held), self.unit
        if self.free_copies:
            for other in held:  # each holder's share shrinks from 1/k to 1/(k+1)
                self.charge[other] -= unit // k - unit // (k + 1)
            self.charge[pool] += unit // (k + 1)
        else:
            self.charge[pool] += unit
        self.copies += 1 if k else 0
        held.append(pool)
        self.ever[pool].add(block)

    def _drop(self, pool: int, block: int) -> None:
        held = self.holders[block]
        held.remove(pool)
        k, unit = len(held), self.unit
        if self.free_copies:
            self.charge[pool] -= unit // (k + 1)
            for other in held:
                self.charge[other] += unit // k - unit // (k + 1)
        else:
            self.charge[pool] -= unit
        if k:
            self.copies -= 1
        else:
            del self.holders[block]

    def _evict(self) -> None:
        # Dropping a copy makes the others dearer, so evict until every pool fits.
        over = True
        while over:
            over = False
            for pool, free in enumerate(self.free):
                while free and self.charge[pool] > self.capacity[pool]:
                    self._drop(pool, free.popitem(last=False)[0])
                    over = True


def losses(
    requests: Iterable[SimRequest],
    codec: PromptCodec,
    worker_blocks: Sequence[int],
    spans: Mapping[str, Span] | None = None,
    place: Place = "run",
    *,
    free_copies: bool = False,
) -> Losses:
    """Replay ``requests`` as ``place`` places them (module docs) and count each prompt
    token's cause. ``spans``: the run's timing (needed but for ``reference``)."""
    if not worker_blocks or min(worker_blocks) < 1:
        raise ValueError("every worker's pool needs at least one KV block")
    one = place in ("reference", "one")
    if spans is None and place != "reference":
        raise ValueError(f"place={place!r} replays a run's timing: spans are needed")
    pools = Pools([sum(worker_blocks)] if one else worker_blocks, free_copies=free_copies)
    n_pools = len(pools.capacity)
    size = codec.block_size
    seen: set[int] = set()  # every block some request cached
    running: dict[int, tuple[int, list[int], list[int]]] = {}
    given: dict[int, int] = {}  # first block -> its pool (``partition``)
    shares = [0] * n_pools
    tokens = dict.fromkeys(CAUSES, 0)
    prompt = samples = 0
    copies = 0.0
    room = sum(worker_blocks)
    events = events_of(requests, None if place == "reference" else spans)
    for _, kind, n, request, worker in events:
        if kind != 1:
            pool, chain, output = running.pop(n)
            pools.end(pool, chain, output)
            seen.update(output)
            continue
        chain, _, output = codec.engine_blocks_with_output(
            request.segments, request.reply, request.max_tokens
        )
        limit = min(len(chain), (request.prompt_tokens - 1) // size)
        if one:
            pool = 0
        elif place == "run":
            pool = worker % n_pools
        else:
            first = chain[0] if chain else 0
            if first not in given:
                given[first] = shares.index(min(shares))
                shares[given[first]] += 1
            pool = given[first]
            most = max(range(n_pools), key=lambda p: pools.holds(p, chain, limit))
            if pools.holds(most, chain, limit) > pools.holds(pool, chain, limit):
                pool = most
        hits = pools.holds(pool, chain, limit)
        other = max((pools.holds(p, chain, limit) for p in range(n_pools) if p != pool), default=0)
        known = hits
        while known < limit and chain[known] in seen:
            known += 1
        ever = pools.ever[pool]
        for depth in range(hits, known):
            if depth < other:
                tokens["elsewhere"] += size
            elif chain[depth] in ever:
                tokens["evicted_here"] += size
            else:
                tokens["evicted_away"] += size
        tokens["hit"] += hits * size
        tokens["new"] += request.prompt_tokens - known * size
        prompt += request.prompt_tokens
        copies += pools.copies / room
        samples += 1
        pools.start(pool, chain)
        seen.update(chain)
        running[n] = (pool, chain, output)
    return Losses(prompt, tokens, copies / samples if samples else 0.0)
