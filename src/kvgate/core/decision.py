"""The output of routing: a ``Decision`` (where, which version, and why)."""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.types import Seconds, SessionKey, WorkerId

CAPACITY_FULL = "capacity_full"
"""The reason a policy refuses with when every candidate is at its in-flight limit.

Not a shed: the routing pipeline (``core.route``) queues such a request, or
overflows it when the fleet is wholly pressured.
"""


@dataclass(frozen=True, slots=True)
class Affinity:
    """A remembered binding session key -> (worker, version), as read from the store."""

    session_key: SessionKey
    worker: WorkerId
    version: str
    last_active: Seconds = 0.0


@dataclass(frozen=True, slots=True)
class AffinityWrite:
    """An affinity the driver must write to the store after a decision.

    ``expected`` is the worker the policy saw bound before (``None`` for a new
    session): the store writes with compare-and-set on it, so two replicas
    placing the same new session agree on one worker.
    """

    session_key: SessionKey
    worker: WorkerId
    version: str
    expected: WorkerId | None = None


@dataclass(frozen=True)
class Decision:
    """Where one request goes and why (no ``slots``: see ``decision_for``).

    ``worker is None`` means the request is refused (shed); ``reason`` then says
    why and ``retry_after`` suggests when to come back. ``reason`` is a short
    stable token (``affinity_hit``, ``prefix_match``, ``least_loaded``, ...) used
    as a metric label and in the ``X-Kvgate-Route-Reason`` header.
    """

    worker: WorkerId | None
    reason: str
    version: str | None = None
    affinity: AffinityWrite | None = None
    retry_after: Seconds | None = None
    shared_chars: int = 0
    """Leading characters of the prompt whose KV requests in flight on ``worker`` already
    hold: the request takes new KV for the rest only (``core.pressure.kv_demand_tokens``)."""

    @property
    def shed(self) -> bool:
        """True when the request is refused rather than routed."""
        return self.worker is None

    @classmethod
    def refuse(cls, reason: str, retry_after: Seconds = 1.0) -> Decision:
        """A decision that sheds the request."""
        return cls(worker=None, reason=reason, retry_after=retry_after)


_new = object.__new__


def decision_for(
    worker: WorkerId,
    reason: str,
    version: str | None,
    affinity: AffinityWrite | None,
    shared_chars: int,
) -> Decision:
    """``Decision(worker, reason, version, affinity, None, shared_chars)``, equal to it,
    made in one update of the instance dict: the frozen ``__init__`` sets each field
    through ``object.__setattr__``, and every placed request makes one."""
    made = _new(Decision)
    made.__dict__.update(
        worker=worker,
        reason=reason,
        version=version,
        affinity=affinity,
        retry_after=None,
        shared_chars=shared_chars,
    )
    return made
