"""``power_of_two``: draw two candidates at random, send to the less loaded.

Nearly as balanced as ``least_request`` while not sending every replica's
burst to the same momentarily idle worker (Mitzenmacher's power of two choices).

Example::

    policy: power_of_two
"""

from __future__ import annotations

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.base import PolicyConfig, candidates, load_order, refuse, route
from kvgate.core.policy import PolicyBase, RouteContext


class PowerOfTwoConfig(PolicyConfig):
    """``power_of_two`` has no options beyond the common ones."""


class PowerOfTwo(PolicyBase):
    """Two random choices (``ctx.rng``), the less loaded wins."""

    name = "power_of_two"
    reads_affinity = False  # never reads ctx.affinity, never binds a key

    def __init__(self, config: PowerOfTwoConfig | None = None) -> None:
        self.config = config if config is not None else PowerOfTwoConfig()

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """The less loaded of two random candidates."""
        cands = candidates(request, ctx)
        if not cands:
            return refuse(request, ctx, self.config.retry_after_s)
        if len(cands) == 1:
            return route(cands[0], "power_of_two")
        first, second = ctx.rng.sample(cands, 2)
        winner = second if load_order(second) < load_order(first) else first
        return route(winner, "power_of_two")
