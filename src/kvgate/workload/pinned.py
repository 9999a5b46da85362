"""Replays in which running requests pin their KV: how much of a reference is attainable.

The capacity-aware reference (``workload.bound``) serves every request instantly from
one pool the size of the fleet's KV, so no block is ever held by a running request.
An engine cannot evict a running request's blocks: on small caches they are much of
it, and what is left turns over faster. These replays take each request's timing from
a run of the workload (``spans``: request id -> first token, last token, worker index)
and keep a pool as the engine keeps its cache: a request's prompt chain is looked up
and pinned when it starts, released when it ends (tail first, its output cached
beside it), and only blocks no running request holds are evicted, least recently
used first.

- ``pinned_reference``: one pool of the fleet's KV. Still one pool (a prefix every
  worker needs is held once), on the run's own timing: a tighter reference, not a
  placement any router is promised.
- ``split_replay``: one pool per worker, each request placed as the run placed it
  (``place="run"``: a check of the model against the engines' own hit rate) or on the
  pool holding most of its chain at its start, the least pinned on a tie
  (``place="greedy"``: perfect knowledge of every cache, queues ignored), or on the
  pool its first block was given, unless another holds more of its chain
  (``place="partition"``: each first block seen is given the pool given fewest, so
  requests behind one shared prefix stay together and each pool holds its share of
  the shared prefixes rather than all of them; queues ignored).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Literal

from kvgate.types import Seconds
from kvgate.workload.bound import Bound
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import SimRequest

Span = tuple[Seconds, Seconds, int]
"""When a request ran (first token, last token) and on which worker (its index)."""


def events_of(
    requests: Iterable[SimRequest], spans: Mapping[str, Span] | None
) -> list[tuple[Seconds, int, int, SimRequest, int]]:
    """Starts (1) and ends in time order, each with its request's index, the request and
    its worker: ends before starts at one instant, but a request that took no time ends
    (2) after it starts. Without ``spans``, each request in arrival order, ending as it
    starts; a request without a span is left out."""
    events: list[tuple[Seconds, int, int, SimRequest, int]] = []
    for n, request in enumerate(requests):
        if spans is None:
            events += [(float(n), 1, n, request, 0), (float(n), 2, n, request, 0)]
            continue
        span = spans.get(request.request_id)
        if span is not None:
            start, end, worker = span
            end = end if end > start else start
            events.append((start, 1, n, request, worker))
            events.append((end, 0 if end > start else 2, n, request, worker))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    return events


def unpin(pinned: dict[int, int], chain: list[int]) -> None:
    """A request ends: each block of its ``chain`` held by one running request fewer."""
    for block in chain:
        held = pinned[block] - 1
        if held:
            pinned[block] = held
        else:
            del pinned[block]


class PinnedPool:
    """One LRU cache of ``capacity`` blocks whose running requests' chains are pinned."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free: OrderedDict[int, None] = OrderedDict()  # unpinned, LRU first
        self.pinned: dict[int, int] = {}  # block -> running requests holding it

    def holds(self, chain: list[int], limit: int) -> int:
        """Leading blocks of ``chain`` (at most ``limit``) the pool holds."""
        hits = 0
        while hits < limit and (chain[hits] in self.pinned or chain[hits] in self.free):
            hits += 1
        return hits

    def start(self, chain: list[int]) -> None:
        """A request starts: its chain is cached and pinned."""
        pinned, free = self.pinned, self.free
        for block in chain:
            free.pop(block, None)
            pinned[block] = pinned.get(block, 0) + 1
        self._evict()

    def end(self, chain: list[int], output: list[int]) -> None:
        """A request ends: its chain is released, tail first, with its output beside it."""
        pinned, free = self.pinned, self.free
        unpin(pinned, chain)
        for block in reversed((*chain, *output)):
            if block not in pinned:
                free[block] = None
                free.move_to_end(block)
        self._evict()

    def _evict(self) -> None:
        free = self.free
        while free and len(free) + len(self.pinned) > self.capacity:
            free.popitem(last=False)


def _replay(
    requests: Iterable[SimRequest],
    codec: PromptCodec,
    pools: list[PinnedPool],
    spans: Mapping[str, Span],
    place: Literal["one", "run", "greedy", "partition"],
) -> Bound:
    block_size = codec.block_size
    events = events_of(requests, spans)
    running: dict[int, tuple[PinnedPool, list[int]]] = {}
    given: dict[int, int] = {}  # first block -> its pool (``partition``)
    shares = [0] * len(pools)  # first blocks given each pool
    total = prompt = cached = 0
    for _, kind, n, request, worker in events:
        if kind != 1:
            pool, chain = running.pop(n)
            output = codec.engine_blocks_with_output(
                request.segments, request.reply, request.max_tokens
            )[2]
            pool.end(chain, output)
            continue
        chain = codec.engine_blocks_with_output(
            request.segments, request.reply, request.max_tokens
        )[0]
        limit = min(len(chain), (request.prompt_tokens - 1) // block_size)
        if place == "one":
            pool = pools[0]
        elif place == "run":
            pool = pools[worker % len(pools)]
        elif place == "greedy":
            pool = max(pools, key=lambda p: (p.holds(chain, limit), -len(p.pinned)))
        else:
            first = chain[0] if chain else 0
            if first not in given:
                given[first] = shares.index(min(shares))
                shares[given[first]] += 1
            pool = pools[given[first]]
            most = max(pools, key=lambda p: p.holds(chain, limit))
            if most.holds(chain, limit) > pool.holds(chain, limit):
                pool = most
        hits = pool.holds(chain, limit)
        total += 1
        prompt += request.prompt_tokens
        cached += hits * block_size
        pool.start(chain)
        running[n] = (pool, chain)
    capacity = sum(p.capacity for p in pools)
    return Bound(cached / prompt if prompt else 0.0, total, prompt, cached, capacity)


def pinned_reference(
    requests: Iterable[SimRequest],
    codec: PromptCodec,
    capacity_blocks: int,
    spans: Mapping[str, Span],
) -> Bound:
    """One pool of the fleet's ``capacity_blocks`` in which running requests pin their
    chains, on the timing of ``spans`` (a request without one, refused, is left out)."""
    if capacity_blocks < 1:
        raise ValueError("the pinned reference needs at least one KV block")
    return _replay(requests, codec, [PinnedPool(capacity_blocks)], spans, "one")


def split_replay(
    requests: Iterable[SimRequest],
    codec: PromptCodec,
    worker_blocks: list[int],
    spans: Mapping[str, Span],
    place: Literal["run", "greedy", "partition"],
) -> Bound:
    """One pinned pool per worker (``worker_blocks`` each), requests placed by ``place``
    (module docs), on the timing of ``spans``."""
    if not worker_blocks or min(worker_blocks) < 1:
        raise ValueError("every worker's pool needs at least one KV block")
    return _replay(requests, codec, [PinnedPool(b) for b in worker_blocks], spans, place)
