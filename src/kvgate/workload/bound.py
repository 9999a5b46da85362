"""Reference hit rates: the infinite-cache bound and the capacity-aware reference.

The *infinite-cache bound*: one worker with an infinite KV cache that never
evicts serves every request in arrival order; a request hits the blocks any
earlier request (prompt or reply) produced. No routing can beat it, but when the
fleet's KV is smaller than the working set it is out of reach for everyone.

The *capacity-aware reference*: the same replay on one cache the size of the
whole fleet's KV (total blocks, the engine's block size) with LRU eviction, the
tail of a request's chain evicted before its head as the engine frees it, and
the output the engines cache put in it too (the reply's blocks, or a reply-less
request's own output, which nothing hits but which takes room). It is
what perfect routing could keep if the fleet's memory were one pool, so a
router within a few percent of it has little left to gain at that cache size.

Every request is instantaneous there: none of the fleet's KV is ever held by a
running request. ``workload.pinned`` replays the same requests with the run's timing,
running requests pinning their blocks (``pinned_reference``), and on one pool per
worker (``split_replay``).

Both use the engine's hit rule: whole blocks only, and the last prompt token is
always computed. A policy's hit rate divided by them says how much of the
reachable reuse it captured.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import SimRequest


@dataclass(frozen=True, slots=True)
class Bound:
    """A reference's figures: hit rate, and the token counts it is made of.

    ``capacity_blocks`` is the cache size in blocks (None: infinite).
    """

    hit_rate: float
    requests: int
    prompt_tokens: int
    cached_tokens: int
    capacity_blocks: int | None = None


def _replay(requests: Iterable[SimRequest], codec: PromptCodec, capacity: int | None) -> Bound:
    """One cache of ``capacity`` blocks (None: unbounded) serving every request in order."""
    block_size = codec.block_size
    cache: OrderedDict[int, None] = OrderedDict()  # least recently used first
    n = 0
    prompt = 0
    cached = 0
    for request in requests:
        chain, reply, output = codec.engine_blocks_with_output(
            request.segments, request.reply, request.max_tokens
        )
        limit = min(len(chain), (request.prompt_tokens - 1) // block_size)
        hits = 0
        while hits < limit and chain[hits] in cache:
            hits += 1
        n += 1
        prompt += request.prompt_tokens
        cached += hits * block_size
        if capacity is None:
            cache.update(dict.fromkeys(chain))
            cache.update(dict.fromkeys(reply))
            continue
        # The engines cache a reply-less request's own output too (nothing hits it,
        # but it takes room). Released tail first, as the engine frees a finished
        # sequence: the head of the chain ends most recently used, so it is evicted last.
        for block in reversed((*chain, *output)):
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return Bound(cached / prompt if prompt else 0.0, n, prompt, cached, capacity)


def infinite_cache_bound(requests: Iterable[SimRequest], codec: PromptCodec) -> Bound:
    """Replay ``requests`` on one never-evicting worker and measure its hit rate."""
    return _replay(requests, codec, None)


def capacity_reference(
    requests: Iterable[SimRequest], codec: PromptCodec, capacity_blocks: int
) -> Bound:
    """Replay ``requests`` on one LRU cache of the fleet's ``capacity_blocks`` KV blocks."""
    if capacity_blocks < 1:
        raise ValueError("the capacity-aware reference needs at least one KV block")
    return _replay(requests, codec, capacity_blocks)
