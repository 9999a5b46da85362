"""The infinite-cache bound: the best prefix-cache hit rate any routing could reach.

One worker with an infinite KV cache that never evicts serves every request in
arrival order; a request hits the blocks any earlier request (prompt or reply)
produced. The engine's own hit rule applies: whole blocks only, and the last
prompt token is always computed. A policy's hit rate divided by this bound says
how much of the reachable reuse it captured.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import SimRequest


@dataclass(frozen=True, slots=True)
class Bound:
    """The bound's figures: hit rate, and the token counts it is made of."""

    hit_rate: float
    requests: int
    prompt_tokens: int
    cached_tokens: int


def infinite_cache_bound(requests: Iterable[SimRequest], codec: PromptCodec) -> Bound:
    """Replay ``requests`` on one never-evicting worker and measure its hit rate."""
    block_size = codec.block_size
    seen: set[int] = set()
    n = 0
    prompt = 0
    cached = 0
    for request in requests:
        chain, reply = codec.engine_blocks_with_reply(request.segments, request.reply)
        limit = min(len(chain), (request.prompt_tokens - 1) // block_size)
        hits = 0
        while hits < limit and chain[hits] in seen:
            hits += 1
        n += 1
        prompt += request.prompt_tokens
        cached += hits * block_size
        seen.update(chain)
        seen.update(reply)
    return Bound(cached / prompt if prompt else 0.0, n, prompt, cached)
