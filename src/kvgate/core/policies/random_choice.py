"""``random``: each request to a candidate drawn uniformly with the driver's seeded rng.

Example::

    policy: random
"""

from __future__ import annotations

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.base import PolicyConfig, candidates, refuse, route
from kvgate.core.policy import PolicyBase, RouteContext


class RandomConfig(PolicyConfig):
    """``random`` has no options beyond the common ones."""


class RandomChoice(PolicyBase):
    """Uniform choice among candidates, using ``ctx.rng`` (never module-level random)."""

    name = "random"
    reads_affinity = False  # never reads ctx.affinity, never binds a key

    def __init__(self, config: RandomConfig | None = None) -> None:
        self.config = config if config is not None else RandomConfig()

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """A uniformly random candidate."""
        cands = candidates(request, ctx)
        if not cands:
            return refuse(request, ctx, self.config.retry_after_s)
        return route(ctx.rng.choice(cands), "random")
