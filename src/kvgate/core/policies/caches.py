"""What each worker's cache holds of a request, and what a placement there would evict.

Two interfaces ``ttft`` reads, so better sources plug in without touching it:

- ``Residency.held(request, ctx)``: per worker, the characters of the request's prompt
  its cache holds (the leading part of its chain). ``IndexResidency`` answers from every
  source there is, best first: the engine itself where the worker publishes KV events
  (``ctx.resident``, read from the exact index by the driver: its word replaces every
  other claim on that worker; it is one step behind this replica's own, so the chains of
  requests in flight there count too: without them, siblings of a new shared prefix that
  arrived while its first request waited in the engine's queue all went elsewhere); this
  replica's approximate ``PrefixIndex`` (what was sent where, corrected by
  ``cached_tokens``); and the shared store's prefix state (``ctx.holders``).
- ``evicted_tokens(...)``: the predicted cost, in prefill tokens, of the blocks a placement's
  new KV pushes out of a worker's cache that later requests would have hit. KV reserved
  for sessions away on a tool call (``WorkerState.kv_reserved_tokens``, certain to come
  back) is an input: it is the oldest, so LRU evicts it first, and every evicted token of
  it is recomputed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from kvgate.core.features import RequestFeatures
from kvgate.core.policies.running import RunningBlocks
from kvgate.core.policy import RouteContext
from kvgate.core.prefix_index import PrefixIndex
from kvgate.types import WorkerId


class Residency(Protocol):
    """Where a request's prompt is cached."""

    def held(self, request: RequestFeatures, ctx: RouteContext) -> dict[WorkerId, int]:
        """Characters of ``request``'s prompt each worker holds (workers holding none may
        be left out)."""
        ...

    def resident(self, request: RequestFeatures, worker: WorkerId) -> int | None:
        """Characters of ``request``'s prompt ``worker`` likely still holds, where that is
        less than ``held`` said of it (``None``: nothing to take back)."""
        ...


class IndexResidency:
    """``Residency`` from the engines' KV events, a policy's index and the store."""

    def __init__(self, index: PrefixIndex, running: RunningBlocks) -> None:
        self.index = index
        self.running = running
        # The last request's index claims (blocks) and the store's holders (``resident``).
        self._claims: tuple[str, dict[WorkerId, int], Mapping[WorkerId, int]] = ("", {}, {})

    def held(self, request: RequestFeatures, ctx: RouteContext) -> dict[WorkerId, int]:
        """The engine's word where it publishes events, else the deeper of the index's
        match and the store's holders, in characters."""
        hashes = request.prefix_hashes
        found = self.index.match(hashes) if hashes else {}
        resident = ctx.resident
        exact = resident.exact if resident is not None else ()
        claims = {w: d for w, d in found.items() if w not in exact} if exact else found.copy()
        self._claims = (request.request_id, claims, ctx.holders)
        for worker, depth in ctx.holders.items():
            if depth > found.get(worker, 0):
                found[worker] = min(depth, len(hashes))
        prompt, chars = request.prompt_chars, self.index.depth_chars
        # Most workers hold a chain to one of a few depths: one conversion a depth.
        cut = {d: c if (c := chars(d)) < prompt else prompt for d in set(found.values())}
        if resident is None:
            return {w: cut[d] for w, d in found.items()}
        held = {w: cut[d] for w, d in found.items() if w not in exact}
        for worker in exact:
            told = resident.chars.get(worker, 0)
            flying = chars(self.running.shared_depth(worker, hashes)) if hashes else 0
            most = min(max(told, flying), prompt)
            if most:
                held[worker] = most
        return held

    def resident(self, request: RequestFeatures, worker: WorkerId) -> int | None:
        """The index's claim on ``worker`` cut where more than a KV turnover was sent there
        after it (``PrefixIndex.resident_depth``): the engine's LRU has likely evicted the
        rest, and a TTFT predicted on it is short by the recompute. The store's holders
        (another replica's placements) stand."""
        rid, found, holders = self._claims
        depth = found.get(worker, 0) if rid == request.request_id else 0
        if not depth:
            return None
        hashes, index = request.prefix_hashes, self.index
        kept = index.resident_depth(hashes, worker, depth)
        if kept >= depth:
            return None
        kept = max(kept, min(holders.get(worker, 0), len(hashes)))
        return min(index.depth_chars(kept), request.prompt_chars)


def evicted_tokens(new_tokens: float, fill: float, reuse: float, reserved: float = 0.0) -> float:
    """What ``new_tokens`` evict on a worker whose cache is ``fill`` full costs later
    requests, in prefill tokens (times the worker's prefill seconds a token: seconds): the
    evicted share of them, each worth the chance it would have been hit (``reuse``, a
    measured hit ratio), or certainly where it is ``reserved`` (the share of the cache held
    for sessions coming back, 0-1). ``fill`` may pass 1: content sent there that is more
    than the cache holds is more that returning requests will ask for."""
    if new_tokens <= 0.0 or fill <= 0.0:
        return 0.0
    return new_tokens * fill * (reuse * (1.0 - reserved) + reserved)
