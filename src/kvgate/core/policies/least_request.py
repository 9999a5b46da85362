"""``least_request``: each request to the candidate with the least load.

Load is the gateway's own in-flight count plus the worker's scraped waiting
queue; ties go to the lower KV usage, then the lower worker id, so the choice is
deterministic.

Example::

    policy: least_request
"""

from __future__ import annotations

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.base import PolicyConfig, candidates, least_loaded, refuse, route
from kvgate.core.policy import PolicyBase, RouteContext


class LeastRequestConfig(PolicyConfig):
    """``least_request`` has no options beyond the common ones."""


class LeastRequest(PolicyBase):
    """Least loaded candidate wins."""

    name = "least_request"
    reads_affinity = False  # never reads ctx.affinity, never binds a key

    def __init__(self, config: LeastRequestConfig | None = None) -> None:
        self.config = config if config is not None else LeastRequestConfig()

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """The least loaded candidate."""
        cands = candidates(request, ctx)
        if not cands:
            return refuse(request, ctx, self.config.retry_after_s)
        return route(least_loaded(cands), "least_loaded")
