"""``default``: sessions stick, new work goes where its prefix is cached, replicas agree.

Used when the config names no policy. In order:

1. A known session (``ctx.affinity``, looked up by ``request.affinity_key``:
   the client's key, or the key derived from the conversation's opening) stays
   on its worker while that worker is routable, not under hard pressure, under
   the sticky threshold and holds at most ``ceil(sticky_load_factor × mean
   load) + sticky_slack`` requests: ``affinity_hit``.
2. Otherwise (a new session, or one whose worker is gone or overloaded; a
   migration avoids the old worker and workers over the sticky threshold), when
   the request will be bound (it has an affinity key) or this replica's prefix
   index knows some of its prefix: the cheapest worker, where a worker costs
   its load × ``load_cost_tokens`` (in prefix blocks) minus the blocks of the
   prompt the index says it holds. Workers at the bounded-load cap
   (``ceil(bounded_load_factor × mean load) + load_slack`` after this request)
   or at ``kv_high`` KV usage are skipped. So a long cached prefix (a document,
   a 2k-token system prompt) draws its requests to its worker, while a short
   shared one (a chat app's system prompt, cheap to compute anywhere) does not
   herd every new session onto the worker that happened to compute it first:
   new sessions spread by load. Reasons: ``prefix_match`` (the worker holding
   the longest match), ``imbalance_least_loaded`` (load outweighed a longer
   match elsewhere), ``least_loaded`` (nothing cached anywhere). Blocks the
   request says are restorable from disk (``restorable_blocks``: a llama.cpp
   slot saved where every worker reads) count on every worker at
   ``restorable_credit``; a worker chosen for them is a ``restorable_match``.
3. A request that will not be bound and whose prefix nobody holds takes the
   rendezvous choice, with bounded loads, of the chain hash of its first
   ``hash_blocks`` blocks: ``hash_primary`` / ``hash_bounded_walk``. Replicas
   that share no prefix index agree there, and requests sharing an opening land
   together. With no prompt either: ``least_loaded``.

   Bound sessions need no hash to agree: their later turns follow the binding,
   and two replicas placing the same new session at once settle on one worker
   through the store's compare-and-set.
   A migration's reason says why it moved (``affinity_overloaded_migrated``,
   ``affinity_lost_migrated``, ``affinity_pressure_migrated``,
   ``affinity_version_migrated``). The new binding is written with an
   ``AffinityWrite`` (``expected`` the old worker), so later turns stick.

Why it beats each component alone:

- ``session_affinity`` places new sessions least loaded, so a session's first
  turn never finds a cached system prompt or document; here it goes where that
  prefix is when it is worth more than the load difference.
- ``prefix_affinity`` only knows what this replica routed, and forgets it when
  its index evicts; the session binding lives in the shared store, so a
  conversation keeps its worker across replicas and index evictions. Its
  bounded-load cap still stops herding onto one warm worker.
- ``consistent_hash`` moves a key whenever the load bound makes it walk and
  moves it back when load falls, losing the cache twice; here a move is
  recorded once and sticks. And it sends every session sharing an opening to
  one worker; here sessions spread.

Example::

    policy: default
    options:
      threshold_kind: fraction
      threshold: 0.8
      sticky_load_factor: 2.0
      bounded_load_factor: 1.5
      load_cost_tokens: 256
      hash_blocks: 4
      hash_load_factor: 1.25
"""

from __future__ import annotations

import math

from pydantic import Field

from kvgate.core.decision import CAPACITY_FULL, Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import WorkerState
from kvgate.core.hashing import bounded_load_cap, bounded_rendezvous
from kvgate.core.policies.base import (
    ThresholdKind,
    affinity_status,
    candidates,
    least_loaded,
    refuse,
    route,
    under_threshold,
)
from kvgate.core.policies.consistent_hash import prefix_hash_key
from kvgate.core.policies.prefix_affinity import (
    PrefixLearning,
    PrefixPlacementConfig,
)
from kvgate.core.policy import RouteContext
from kvgate.types import Seconds, WorkerId


class DefaultConfig(PrefixPlacementConfig):
    """Options of ``default``: stickiness, prefix placement and the hash fallback.

    Of the prefix placement options, ``bounded_load_factor``, ``load_slack``,
    ``kv_high`` and ``index`` apply; ``match_threshold`` and ``balance_*`` are
    ``prefix_affinity``'s rules, which ``load_cost_tokens`` replaces here.
    """

    threshold_kind: ThresholdKind = "fraction"
    threshold: float = Field(default=0.8, gt=0)
    sticky_load_factor: float | None = Field(default=2.0, ge=1)
    sticky_slack: int = Field(default=4, ge=0)
    hash_blocks: int = Field(default=4, ge=1)
    hash_load_factor: float = Field(default=1.25, ge=1)
    use_prefix_key: bool = True
    load_cost_tokens: float = Field(default=256.0, ge=0)
    """Uncached prompt tokens one request of load is worth when placing new work."""
    recent_half_life_s: float = Field(default=60.0, gt=0)
    """Half-life of the per-worker count of recently routed requests (a tie-break)."""
    restorable_credit: float = Field(default=0.9, ge=0, le=1)
    """What a prefix block restorable from disk is worth on any worker, against one in
    the worker's own cache (1): llama.cpp restores a saved slot in 2-15% of the time it
    takes to recompute it (``benchmarks/real_offload.py``)."""


class DefaultPolicy(PrefixLearning):
    """Session affinity, then prefix index, then bounded rendezvous, then least loaded."""

    name = "default"

    def __init__(self, config: DefaultConfig | None = None) -> None:
        self.config = config if config is not None else DefaultConfig()
        super().__init__(self.config.index)
        # Requests routed to each worker, decayed: (count, as of when). Among equally
        # loaded workers a new session goes to the one that got least lately, so a
        # trickle of sessions at low load does not pile onto one worker id.
        self._recent: dict[WorkerId, tuple[float, Seconds]] = {}

    def _recent_count(self, worker: WorkerId, now: Seconds) -> float:
        """Requests routed to ``worker`` lately, halved every ``recent_half_life_s``."""
        entry = self._recent.get(worker)
        if entry is None:
            return 0.0
        count, at = entry
        return count * math.exp2(-max(0.0, now - at) / self.config.recent_half_life_s)

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """Index the request's chain on ``worker`` and count it as recent there."""
        super().on_routed(request, worker, now)
        self._recent[worker] = (self._recent_count(worker, now) + 1.0, now)

    def on_worker_removed(self, worker: WorkerId) -> None:
        """Forget the worker's blocks and counts."""
        super().on_worker_removed(worker)
        self._recent.pop(worker, None)

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """Stay, or place (prefix, hash, least loaded), or refuse; see the module docs."""
        cfg = self.config
        cands = candidates(request, ctx)
        sticky_cap = None
        if ctx.affinity is not None and cands and cfg.sticky_load_factor is not None:
            total = sum([w.in_flight + (w.waiting or 0) for w in cands])  # ``load``, inlined
            sticky_cap = bounded_load_cap(
                total, len(cands), cfg.sticky_load_factor, cfg.sticky_slack
            )
        bound, why = affinity_status(request, ctx, cfg.threshold_kind, cfg.threshold, sticky_cap)
        if bound is not None:
            return route(bound, "affinity_hit")
        if not cands:
            return refuse(request, ctx, cfg.retry_after_s)

        old = ctx.affinity.worker if ctx.affinity is not None else None
        pool = cands
        if old is not None:
            pool = [
                w
                for w in cands
                if w.id != old and under_threshold(w, cfg.threshold_kind, cfg.threshold)
            ]
            if not pool:
                return Decision.refuse(CAPACITY_FULL, cfg.retry_after_s)

        keyed = request.has_session or (cfg.use_prefix_key and request.prefix_key is not None)
        worker, reason = self._place(request, pool, keyed, ctx.fleet.now)
        self._remember_capacity(worker)
        if why != "new":
            reason = f"affinity_{why}_migrated"
        return route(worker, reason, request if keyed else None, expected=old)

    def _place(
        self, request: RequestFeatures, pool: list[WorkerState], keyed: bool, now: Seconds
    ) -> tuple[WorkerState, str]:
        cfg = self.config
        hashes = request.prefix_hashes
        matches = self.index.match(hashes) if hashes else {}
        restorable = int(request.restorable_blocks * cfg.restorable_credit)
        if restorable:
            # Cache by tier: KV on disk counts on every worker, a little less than in a slot.
            own = matches
            matches = {w.id: max(own.get(w.id, 0), restorable) for w in pool}
            worker, reason = self._cheapest(pool, matches, now)
            if own.get(worker.id, 0) < restorable:
                reason = "restorable_match"  # chosen for what it can restore, not hold
            return worker, reason
        if matches or keyed:
            # A bound session's later turns follow the binding, so where it starts
            # is free to balance; replicas placing it at once agree by compare-and-set.
            return self._cheapest(pool, matches, now)
        # Nothing cached and nothing to bind: replicas agree through the hash.
        key = prefix_hash_key(request, cfg.hash_blocks)
        if key is not None:
            chosen = bounded_rendezvous(key, pool, cfg.hash_load_factor)
            if chosen is not None:
                worker, walked = chosen
                return worker, "hash_bounded_walk" if walked else "hash_primary"
        return least_loaded(pool), "least_loaded"

    def _cheapest(
        self, pool: list[WorkerState], matches: dict[str, int], now: Seconds
    ) -> tuple[WorkerState, str]:
        """The worker where new work costs least: its uncached blocks plus weighted load.

        Workers at the bounded-load cap or at ``kv_high`` are skipped (least loaded
        wins if that leaves none); ties go to the lower load, then the fewer
        requests routed there lately, the lower KV usage, the id.
        """
        cfg = self.config
        index_cfg = self.index.config
        per_load = cfg.load_cost_tokens * index_cfg.chars_per_token / index_cfg.block_chars
        # One pass over plain locals: this runs for every worker on every new session.
        loads = [w.in_flight + (w.waiting or 0) for w in pool]
        cap = bounded_load_cap(sum(loads), len(pool), cfg.bounded_load_factor, cfg.load_slack)
        kv_high = cfg.kv_high
        get = matches.get
        best: WorkerState | None = None
        best_cost = math.inf
        best_tie: tuple[int, float, float, str] | None = None
        for w, load in zip(pool, loads, strict=True):
            if load >= cap:
                continue
            kv = w.kv_usage or 0.0
            if kv >= kv_high:
                continue
            # The prompt's own length is the same everywhere: only the cached part differs.
            cost = per_load * load - get(w.id, 0)
            if cost < best_cost:
                best, best_cost, best_tie = w, cost, None
            elif cost == best_cost and best is not None:
                # Ties are common at low load; only then is the tie-break worth computing.
                if best_tie is None:
                    best_tie = self._tie(best, now)
                tie = self._tie(w, now)
                if tie < best_tie:
                    best, best_tie = w, tie
        top = max(matches.values(), default=0)
        if best is None:
            return least_loaded(pool), "imbalance_least_loaded" if top else "least_loaded"
        if not top:
            return best, "least_loaded"
        return best, "prefix_match" if get(best.id, 0) == top else "imbalance_least_loaded"

    def _tie(self, worker: WorkerState, now: Seconds) -> tuple[int, float, float, str]:
        """Order among equal costs: load, recent requests, KV usage, id."""
        return (worker.load, self._recent_count(worker.id, now), worker.kv_usage or 0.0, worker.id)
