"""``consistent_hash``: rendezvous hashing with bounded loads.

The key is the session key, or, when there is none, the chain hash of the
prompt's first ``hash_blocks`` prefix blocks (which covers all of them), so
requests sharing an opening land together. Every candidate is ranked by
``xxh3(worker id, seed=key)``; the request goes to the first worker in that
order whose load stays within ``ceil(load_factor × average load)`` (+
``load_slack``) after taking it (Mirrokni, Thorup and Zadimoghaddam). Gateway
replicas agree on the choice with no shared state, and when a worker leaves only
its own keys move. Requests with neither key nor prompt go least loaded.

Reasons: ``hash_primary`` (the key's first choice), ``hash_bounded_walk`` (the
first choice was over the bound), ``least_loaded`` (nothing to hash).

Example::

    policy: consistent_hash
    options:
      load_factor: 1.25
      hash_blocks: 4
"""

from __future__ import annotations

from pydantic import Field

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.hashing import bounded_rendezvous, key_hash
from kvgate.core.policies.base import PolicyConfig, candidates, least_loaded, refuse, route
from kvgate.core.policy import PolicyBase, RouteContext


class ConsistentHashConfig(PolicyConfig):
    """Bound and key of ``consistent_hash``."""

    load_factor: float = Field(default=1.25, ge=1)
    load_slack: int = Field(default=0, ge=0)
    hash_blocks: int = Field(default=4, ge=1)


def prefix_hash_key(request: RequestFeatures, blocks: int) -> int | None:
    """The chain hash covering the first ``blocks`` prefix blocks (fewer if shorter)."""
    hashes = request.prefix_hashes
    if not hashes:
        return None
    return hashes[min(blocks, len(hashes)) - 1]


class ConsistentHash(PolicyBase):
    """Stateless, replica-consistent placement by key with bounded loads."""

    name = "consistent_hash"
    reads_affinity = False  # never reads ctx.affinity, never binds a key

    def __init__(self, config: ConsistentHashConfig | None = None) -> None:
        self.config = config if config is not None else ConsistentHashConfig()

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """The key's first worker in rendezvous order within the load bound."""
        cfg = self.config
        cands = candidates(request, ctx)
        if not cands:
            return refuse(request, ctx, cfg.retry_after_s)
        if request.session_key is not None:
            key: int | None = key_hash(request.session_key)
        else:
            key = prefix_hash_key(request, cfg.hash_blocks)
        if key is None:
            return route(least_loaded(cands), "least_loaded")
        chosen = bounded_rendezvous(key, cands, cfg.load_factor, cfg.load_slack)
        assert chosen is not None  # cands is non-empty
        worker, walked = chosen
        return route(worker, "hash_bounded_walk" if walked else "hash_primary")
