"""``cache_aware``: SGLang router's cache-aware policy, modelled, to stand beside ``default``.

The peers of issue 11 (sglang-router 0.3.2, and smg, its successor) route with it, and
``benchmarks/peers.py`` measures them live; this is their rule in kvgate's terms, so the
simulator can put the peer beside ``default`` on any workload and seed. With their
defaults (``cache_threshold`` 0.3, ``balance_abs_threshold`` 64,
``balance_rel_threshold`` 1.5):

1. When the fleet is imbalanced (the most and least loaded workers differ by more than
   ``balance_abs`` requests *and* the most loaded has more than ``balance_rel`` times
   the least's), the least loaded worker. Load is the requests in flight there, as the
   router counts them.
2. Else the longest match of the prompt in a tree of everything sent to each worker
   (an approximate radix tree in the router, one tenant a worker): when it covers more
   than ``threshold`` of the prompt, the worker holding it (the first in fleet order
   among equals).
3. Else the worker whose tree is smallest (fewest characters sent there that its tree
   did not hold yet): new content goes where the least has gone.

Either way the prompt is then added to the chosen worker's tree. The tree forgets
only past ``max_tree_chars`` over all workers (the router trims it every minute; its
default, 64 Mi characters, is never reached in the benchmarks): it knows nothing of
the workers' KV capacity, their usage reports or their queues, which is the point of
the comparison. Here the tree is a ``PrefixIndex`` of the request's block chain, so a
match is counted in whole blocks, as ``default``'s is.

Reasons: ``imbalance_least_loaded``, ``prefix_match``, ``smallest_tree``.

Example::

    policy: cache_aware
    options:
      threshold: 0.3
      balance_abs: 64
      balance_rel: 1.5
"""

from __future__ import annotations

from pydantic import Field

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.base import PolicyConfig, candidates, refuse, route
from kvgate.core.policy import PolicyBase, RouteContext
from kvgate.core.prefix_index import PrefixIndex, PrefixIndexConfig
from kvgate.types import Seconds, WorkerId

TREE_CHARS = 64 * 2**20
"""sglang-router's ``--max-tree-size`` default, in characters over all workers."""


class CacheAwareConfig(PolicyConfig):
    """Options of ``cache_aware``: sglang-router 0.3.2's defaults."""

    threshold: float = Field(default=0.3, ge=0, le=1)
    """The share of the prompt a match must cover (more than) to decide."""
    balance_abs: int = Field(default=64, ge=0)
    balance_rel: float = Field(default=1.5, ge=1)
    max_tree_chars: int = Field(default=TREE_CHARS, ge=1)
    index: PrefixIndexConfig = PrefixIndexConfig()
    """Block sizes of the chain (``block_chars`` etc. follow the features'); the tree's
    bound replaces the index's own sizes."""


class CacheAware(PolicyBase):
    """sglang-router's cache_aware: longest match over a threshold, else smallest tree."""

    name = "cache_aware"
    reads_affinity = False  # never reads ctx.affinity, never binds a key

    def __init__(self, config: CacheAwareConfig | None = None) -> None:
        self.config = cfg = config if config is not None else CacheAwareConfig()
        blocks = max(1, cfg.max_tree_chars // cfg.index.block_chars)
        sized = {"default_worker_blocks": blocks, "max_total_blocks": blocks}
        self.index = PrefixIndex(cfg.index.model_copy(update=sized))
        self._tree_chars: dict[WorkerId, int] = {}

    def tree_chars(self, worker: WorkerId) -> int:
        """Characters added to ``worker``'s tree so far (what its tree did not hold)."""
        return self._tree_chars.get(worker, 0)

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """Least loaded when imbalanced, else the longest match over the threshold,
        else the smallest tree (see the module docs)."""
        cfg = self.config
        cands = candidates(request, ctx)
        if not cands:
            return refuse(request, ctx, cfg.retry_after_s)
        loads = [w.in_flight for w in cands]
        low, high = min(loads), max(loads)
        if high - low > cfg.balance_abs and high > cfg.balance_rel * low:
            return route(cands[loads.index(low)], "imbalance_least_loaded")
        hashes, prompt = request.prefix_hashes, request.prompt_chars
        found = self.index.match(hashes) if hashes else {}
        best, depth = None, 0
        for w in cands:
            held = found.get(w.id, 0)
            if held > depth:
                best, depth = w, held
        if best is not None and prompt and self._chars(depth, prompt) > cfg.threshold * prompt:
            return route(best, "prefix_match")
        tree = self._tree_chars.get
        smallest = min(cands, key=lambda w: tree(w.id, 0))  # the first among equals
        return route(smallest, "smallest_tree")

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """Add the prompt to ``worker``'s tree, counting what it did not hold."""
        hashes = request.prefix_hashes
        held = self.index.match_worker(hashes, worker) if hashes else 0
        added = request.prompt_chars - self._chars(held, request.prompt_chars)
        self._tree_chars[worker] = self._tree_chars.get(worker, 0) + added
        if hashes:
            self.index.insert(worker, hashes)

    def on_worker_removed(self, worker: WorkerId) -> None:
        """Forget the worker's tree."""
        self._tree_chars.pop(worker, None)
        self.index.remove_worker(worker)

    def _chars(self, depth: int, prompt: int) -> int:
        chars = self.index.depth_chars(depth)
        return chars if chars < prompt else prompt
