"""``prefix_affinity``: send a request where its prompt prefix is most likely cached.

A bounded approximate index (``core.prefix_index``) remembers which prefix
blocks each worker was recently sent, and forgets roughly when the worker's KV
cache would. For each request it finds, per candidate, how many leading blocks
the worker holds. The best match wins when it covers at least
``match_threshold`` of the prompt's blocks and its worker is not overloaded;
otherwise the least loaded candidate wins.

"Overloaded" guards against herding (every request of a hot prefix piling on
the one warm worker). A worker is overloaded for the prefix branch when any of:

- it would hold more than ``ceil(bounded_load_factor × mean load) + load_slack``
  requests after this one (bounded loads, as in consistent hashing with bounded
  loads): this fires at any concurrency, e.g. at 32 in flight over 8 workers the
  warm worker stops taking new traffic at 8, where an absolute threshold of 64
  would never fire;
- its load exceeds the least loaded candidate's by more than ``balance_abs`` and
  by a factor of ``balance_rel`` (SGLang's imbalance rule, kept for parity);
- its scraped KV usage is at ``kv_high`` or more (it would evict to admit us).

Reasons: ``prefix_match`` (best match taken), ``imbalance_least_loaded`` (a
match was good enough but every matching worker was overloaded),
``least_loaded`` (no match good enough).

Example::

    policy: prefix_affinity
    options:
      match_threshold: 0.3
      bounded_load_factor: 1.5
      load_slack: 2
      balance_abs: 64
      balance_rel: 1.5
      kv_high: 0.9
      index:
        block_chars: 256
        max_total_blocks: 500000
"""

from __future__ import annotations

import math

from pydantic import Field

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import WorkerState
from kvgate.core.hashing import bounded_load_cap
from kvgate.core.policies.base import PolicyConfig, candidates, least_loaded, refuse, route
from kvgate.core.policy import PolicyBase, RouteContext
from kvgate.core.prefix_index import PrefixIndex, PrefixIndexConfig
from kvgate.types import Seconds, WorkerId


class PrefixPlacementConfig(PolicyConfig):
    """When a prefix match may decide, and when load overrides it."""

    match_threshold: float = Field(default=0.3, ge=0, le=1)
    bounded_load_factor: float = Field(default=1.5, ge=1)
    load_slack: int = Field(default=2, ge=0)
    balance_abs: int = Field(default=64, ge=0)
    balance_rel: float = Field(default=1.5, ge=1)
    kv_high: float = Field(default=0.9, gt=0, le=1)
    index: PrefixIndexConfig = PrefixIndexConfig()


class PrefixAffinityConfig(PrefixPlacementConfig):
    """Options of ``prefix_affinity`` (see the module docs for an example)."""


def place_by_prefix(
    request: RequestFeatures,
    cands: list[WorkerState],
    index: PrefixIndex,
    cfg: PrefixPlacementConfig,
) -> tuple[WorkerState, str] | None:
    """The prefix branch: ``(worker, reason)``, or ``None`` when no match is good enough.

    ``cands`` must be non-empty. Among candidates whose match covers at least
    ``match_threshold`` of the chain and that are not overloaded, the longest
    match wins, then the least loaded; if every good match is overloaded, the
    least loaded candidate wins with ``imbalance_least_loaded``.
    """
    hashes = request.prefix_hashes
    if not hashes:
        return None
    needed = max(1, math.ceil(cfg.match_threshold * len(hashes)))
    matches = index.match(hashes, min_depth=needed)
    if not matches:
        return None
    # One pass over plain locals: this runs for every worker on every request.
    loads = [w.in_flight + (w.waiting or 0) for w in cands]
    min_load = min(loads)
    cap = bounded_load_cap(sum(loads), len(cands), cfg.bounded_load_factor, cfg.load_slack)
    balance_abs = min_load + cfg.balance_abs
    balance_rel = cfg.balance_rel * min_load
    kv_high = cfg.kv_high
    get = matches.get
    best: WorkerState | None = None
    best_depth = 0
    best_load = 0
    matched_any = False
    for w, load in zip(cands, loads, strict=True):
        depth = get(w.id, 0)
        if depth < needed or depth < best_depth:
            continue
        matched_any = True
        if load >= cap or (load > balance_abs and load > balance_rel):
            continue
        kv = w.kv_usage
        if kv is not None and kv >= kv_high:
            continue
        if (
            best is None
            or depth > best_depth
            or (load, kv or 0.0, w.id) < (best_load, best.kv_usage or 0.0, best.id)
        ):
            best, best_depth, best_load = w, depth, load
    if best is not None:
        return best, "prefix_match"
    if matched_any:
        return least_loaded(cands), "imbalance_least_loaded"
    return None


class PrefixLearning(PolicyBase):
    """Hooks that keep a ``PrefixIndex`` in step with routing and usage reports."""

    def __init__(self, index_config: PrefixIndexConfig) -> None:
        self.index = PrefixIndex(index_config)
        # KV capacity seen in the snapshot for the worker just chosen; applied in
        # on_routed, which does not see the snapshot.
        self._kv_hint: dict[WorkerId, int | None] = {}

    def _remember_capacity(self, worker: WorkerState) -> None:
        self._kv_hint[worker.id] = worker.kv_capacity_tokens

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """Record the request's chain as (soon) cached on ``worker``."""
        if worker in self._kv_hint:
            self.index.set_kv_capacity(worker, self._kv_hint[worker])
        self.index.note_routed(request.request_id, worker, request.prefix_hashes)

    def on_usage(
        self,
        request: RequestFeatures,
        worker: WorkerId,
        prompt_tokens: int,
        cached_tokens: int,
        now: Seconds,
        *,
        completion_tokens: int = 0,
    ) -> None:
        """Shrink or grow ``worker``'s share of the index by how well it predicted."""
        self.index.note_usage(
            request.request_id, worker, request.prompt_chars, prompt_tokens, cached_tokens
        )

    def on_worker_removed(self, worker: WorkerId) -> None:
        """Forget the worker's blocks."""
        self._kv_hint.pop(worker, None)
        self.index.remove_worker(worker)


class PrefixAffinity(PrefixLearning):
    """Cache-aware routing on an approximate, bounded per-worker prefix index."""

    name = "prefix_affinity"
    reads_affinity = False  # never reads ctx.affinity, never binds a key

    def __init__(self, config: PrefixPlacementConfig | None = None) -> None:
        self.config = config if config is not None else PrefixPlacementConfig()
        super().__init__(self.config.index)

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """Best prefix match unless overloaded, else least loaded."""
        cands = candidates(request, ctx)
        if not cands:
            return refuse(request, ctx, self.config.retry_after_s)
        placed = place_by_prefix(request, cands, self.index, self.config)
        worker, reason = placed if placed is not None else (least_loaded(cands), "least_loaded")
        self._remember_capacity(worker)
        return route(worker, reason)
