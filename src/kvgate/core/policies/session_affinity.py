"""``session_affinity``: sticky sessions, moved only when their worker cannot keep them.

A session (the client's own key: header or ``user``) stays on the worker it is
bound to (``ctx.affinity``, read by the driver from the store) while that worker
is routable and under the sticky threshold: ``threshold`` in-flight requests, or ``threshold ×
max_in_flight`` with ``threshold_kind: fraction``. Over it, the session migrates
to the least loaded worker that is under the threshold and accepts new
sessions, and the binding is rewritten (``AffinityWrite`` with ``expected`` the
old worker, so concurrent replicas agree on one move). When no worker is under
the threshold the request is refused with ``capacity_full``. New sessions go to
the least loaded worker. Requests without a key are routed least loaded.

Reasons: ``affinity_hit``, ``affinity_{overloaded,lost,pressure,version}_migrated``,
``new_session_least_loaded``, ``least_loaded``.

Example::

    policy: session_affinity
    options:
      threshold_kind: fraction   # or in_flight
      threshold: 0.8
"""

from __future__ import annotations

from pydantic import Field

from kvgate.core.decision import CAPACITY_FULL, Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.base import (
    PolicyConfig,
    ThresholdKind,
    affinity_status,
    candidates,
    least_loaded,
    refuse,
    route,
    under_threshold,
)
from kvgate.core.policy import PolicyBase, RouteContext


class SessionAffinityConfig(PolicyConfig):
    """Sticky threshold of ``session_affinity``."""

    threshold_kind: ThresholdKind = "fraction"
    threshold: float = Field(default=0.8, gt=0)


class SessionAffinity(PolicyBase):
    """Sticky map from session key to worker, with threshold-driven migration."""

    name = "session_affinity"

    def __init__(self, config: SessionAffinityConfig | None = None) -> None:
        self.config = config if config is not None else SessionAffinityConfig()

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """Stay, migrate, place a new session, or refuse (see the module docs)."""
        cfg = self.config
        bound, why = affinity_status(request, ctx, cfg.threshold_kind, cfg.threshold)
        if bound is not None:
            return route(bound, "affinity_hit")
        cands = candidates(request, ctx)
        if not cands:
            return refuse(request, ctx, cfg.retry_after_s)
        if why == "new":
            if request.has_session:
                return route(least_loaded(cands), "new_session_least_loaded", request)
            return route(least_loaded(cands), "least_loaded")
        old = ctx.affinity.worker if ctx.affinity is not None else None
        targets = [
            w
            for w in cands
            if w.id != old and under_threshold(w, cfg.threshold_kind, cfg.threshold)
        ]
        if not targets:
            return Decision.refuse(CAPACITY_FULL, cfg.retry_after_s)
        return route(least_loaded(targets), f"affinity_{why}_migrated", request, expected=old)
