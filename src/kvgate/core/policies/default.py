"""``default``: sessions stick, new work goes where its prefix is cached, replicas agree.

Used when the config names no policy. In order:

1. A known session (``ctx.affinity``, looked up by ``request.affinity_key``:
   the client's key, or the key derived from the conversation's opening) stays
   on its worker while that worker is routable, not under hard pressure, under
   the sticky threshold and holds at most ``ceil(sticky_load_factor × mean
   load) + sticky_slack`` requests: ``affinity_hit``.
2. Otherwise (a new session, or one whose worker is gone or overloaded; a
   migration avoids the old worker and workers over the sticky threshold):
   a. the worker this replica's prefix index says holds the longest prefix, if
      the match is good enough and the worker not overloaded (bounded loads,
      as ``prefix_affinity``): ``prefix_match``;
   b. else the rendezvous choice, with bounded loads, of the chain hash of the
      first ``hash_blocks`` blocks (or of the session key when there is no
      prompt): ``hash_primary`` / ``hash_bounded_walk``. Replicas that share no
      prefix index still agree here, and requests sharing an opening (a system
      prompt) land together, so it is cached once;
   c. else least loaded: ``least_loaded``.
   A migration's reason says why it moved (``affinity_overloaded_migrated``,
   ``affinity_lost_migrated``, ``affinity_pressure_migrated``,
   ``affinity_version_migrated``). The new binding is written with an
   ``AffinityWrite`` (``expected`` the old worker), so later turns stick.

Why it beats each component alone:

- ``session_affinity`` places new sessions least loaded, so a session's first
  turn never finds a cached system prompt; here it goes where that prefix is.
- ``prefix_affinity`` only knows what this replica routed, and forgets it when
  its index evicts; the session binding lives in the shared store, so a
  conversation keeps its worker across replicas and index evictions. Its
  bounded-load cap still stops herding onto one warm worker.
- ``consistent_hash`` moves a key whenever the load bound makes it walk and
  moves it back when load falls, losing the cache twice; here a move is
  recorded once and sticks. And the prefix index finds a cached copy even when
  the key hashes elsewhere (after a walk, or when workers joined).

Example::

    policy: default
    options:
      threshold_kind: fraction
      threshold: 0.8
      sticky_load_factor: 2.0
      match_threshold: 0.3
      bounded_load_factor: 1.5
      hash_blocks: 4
      hash_load_factor: 1.25
"""

from __future__ import annotations

from pydantic import Field

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import WorkerState
from kvgate.core.hashing import bounded_load_cap, bounded_rendezvous, key_hash
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
    place_by_prefix,
)
from kvgate.core.policy import RouteContext


class DefaultConfig(PrefixPlacementConfig):
    """Options of ``default``: stickiness, prefix placement and the hash fallback."""

    threshold_kind: ThresholdKind = "fraction"
    threshold: float = Field(default=0.8, gt=0)
    sticky_load_factor: float | None = Field(default=2.0, ge=1)
    sticky_slack: int = Field(default=4, ge=0)
    hash_blocks: int = Field(default=4, ge=1)
    hash_load_factor: float = Field(default=1.25, ge=1)
    use_prefix_key: bool = True


class DefaultPolicy(PrefixLearning):
    """Session affinity, then prefix index, then bounded rendezvous, then least loaded."""

    name = "default"

    def __init__(self, config: DefaultConfig | None = None) -> None:
        self.config = config if config is not None else DefaultConfig()
        super().__init__(self.config.index)

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """Stay, or place (prefix, hash, least loaded), or refuse; see the module docs."""
        cfg = self.config
        cands = candidates(request, ctx)
        sticky_cap = None
        if ctx.affinity is not None and cands and cfg.sticky_load_factor is not None:
            total = sum(w.load for w in cands)
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
                return Decision.refuse("capacity_full", cfg.retry_after_s)

        worker, reason = self._place(request, pool)
        self._remember_capacity(worker)
        if why != "new":
            reason = f"affinity_{why}_migrated"
        keyed = request.has_session or (cfg.use_prefix_key and request.prefix_key is not None)
        return route(worker, reason, request if keyed else None, expected=old)

    def _place(self, request: RequestFeatures, pool: list[WorkerState]) -> tuple[WorkerState, str]:
        cfg = self.config
        placed = place_by_prefix(request, pool, self.index, cfg)
        if placed is not None and placed[1] == "prefix_match":
            return placed
        # A good match whose workers are all overloaded falls through to the hash,
        # so replicas send the overflow to the same next worker.
        key = prefix_hash_key(request, cfg.hash_blocks)
        if key is None and request.affinity_key is not None:
            key = key_hash(request.affinity_key)
        if key is not None:
            chosen = bounded_rendezvous(key, pool, cfg.hash_load_factor)
            if chosen is not None:
                worker, walked = chosen
                return worker, "hash_bounded_walk" if walked else "hash_primary"
        return least_loaded(pool), "least_loaded"
