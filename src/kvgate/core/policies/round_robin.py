"""``round_robin``: each request to the next candidate in turn.

Ignores load, sessions and prefixes: the baseline every other policy is
measured against.

Example::

    policy: round_robin
"""

from __future__ import annotations

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.base import PolicyConfig, candidates, refuse, route
from kvgate.core.policy import PolicyBase, RouteContext


class RoundRobinConfig(PolicyConfig):
    """``round_robin`` has no options beyond the common ones."""


class RoundRobin(PolicyBase):
    """Cycles through the candidates in fleet order."""

    name = "round_robin"
    reads_affinity = False  # never reads ctx.affinity, never binds a key

    def __init__(self, config: RoundRobinConfig | None = None) -> None:
        self.config = config if config is not None else RoundRobinConfig()
        self._turn = 0

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """The next candidate in turn."""
        cands = candidates(request, ctx)
        if not cands:
            return refuse(request, ctx, self.config.retry_after_s)
        worker = cands[self._turn % len(cands)]
        self._turn += 1
        return route(worker, "round_robin")
