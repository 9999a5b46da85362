"""Admission: admit, queue (bounded, for a bounded wait) or shed, as pure decisions.

Each worker takes at most ``max_in_flight`` requests through the gateway (the
driver copies ``worker_max_in_flight`` into ``WorkerState.max_in_flight``). The
driver asks, in this order:

1. ``admit(config, priority, queue_depth, fleet_saturation(fleet))`` before
   routing. ``Admit``: ask the policy. ``Shed``: answer 429 with ``Retry-After``.
   Sheddable requests are refused here once the fleet is nearly saturated
   (``sheddable_shed_at``), so they never take a slot critical work needs.
2. If the policy refuses with ``capacity_full`` (every candidate is full), ask
   ``admit(..., fleet_saturation=1.0)``: ``Queue(max_wait)`` puts the request in
   the driver's wait queue, ordered by ``wait_order`` (priority, then arrival);
   the driver re-routes the head whenever a slot frees.
3. A request still queued after ``max_wait`` is answered with ``timed_out()``.

The queue is bounded and partly reserved: standard requests may fill only
``standard_queue_share`` of it, so critical requests still find room when it is
busy; sheddable requests never queue by default. Critical requests wait longest.

The queue is shared fairly between tenants (``RequestFeatures.tenant``: an API key, or
the session scope). A request that finds it full takes the place of the newest waiter
of the tenant holding the most of the room it competes for (``share_room``: waiters no
more important than it), provided that tenant holds at least two more of it than the
request's own tenant; that waiter is refused (``QUEUE_SHARE``). So one tenant's flood
fills the queue only while nobody else wants it, and a tenant under its fair share is
never refused for it: whoever holds the most holds at least the fair share. With one
tenant nobody is displaced: a full queue refuses the newcomer, as it always did.

Example::

    admission:
      worker_max_in_flight: 256
      queue_size: 1024
      max_wait_critical_s: 30
      max_wait_standard_s: 10
      max_wait_sheddable_s: 0
      sheddable_shed_at: 0.9
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from kvgate.core.fleet import ROUTABLE_HEALTH, FleetSnapshot
from kvgate.types import Priority, Seconds


class AdmissionConfig(BaseModel):
    """Limits and waits of admission control (the ``admission:`` config section).

    The queue is shared fairly between tenants (an API key, or the session scope of
    ``features.session_scope``; the clients without one share one tenant): a request
    that finds it full takes the place of the newest waiter of the tenant holding the
    most of it (at the request's priority or below), if that tenant holds at least two
    more places than the request's own; that waiter is answered 429 (``queue_share``).
    One tenant's flood fills the queue only while nobody else wants it; with one tenant
    a full queue refuses the newcomer (``queue_full``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    worker_max_in_flight: int = Field(default=256, ge=1)
    queue_size: int = Field(default=1024, ge=0)
    """Requests that may wait for a slot (and for KV room), shared by every tenant fairly."""
    max_wait_critical_s: float = Field(default=30.0, ge=0)
    max_wait_standard_s: float = Field(default=10.0, ge=0)
    max_wait_sheddable_s: float = Field(default=0.0, ge=0)
    standard_queue_share: float = Field(default=0.8, ge=0, le=1)
    sheddable_shed_at: float = Field(default=0.9, ge=0, le=1)
    kv_saturated: float = Field(default=0.95, gt=0, le=1)
    retry_after_s: float = Field(default=1.0, gt=0)
    max_retry_after_s: float = Field(default=30.0, gt=0)

    def max_wait(self, priority: Priority) -> Seconds:
        """How long a request of ``priority`` may wait in the queue."""
        if priority is Priority.CRITICAL:
            return self.max_wait_critical_s
        if priority is Priority.STANDARD:
            return self.max_wait_standard_s
        return self.max_wait_sheddable_s

    def queue_limit(self, priority: Priority) -> int:
        """How deep the queue may be for a request of ``priority`` to still join it."""
        if priority is Priority.CRITICAL:
            return self.queue_size
        return math.floor(self.queue_size * self.standard_queue_share)


@dataclass(frozen=True, slots=True)
class Admit:
    """Route the request now."""

    reason: str = "admitted"


_ADMIT = Admit()
"""``admit``'s usual answer, one immutable value rather than one per request."""

_SHEDDABLE = Priority.SHEDDABLE
"""A module constant: on 3.11 ``Enum.MEMBER`` costs a slow ``EnumType`` lookup a request."""


@dataclass(frozen=True, slots=True)
class Queue:
    """Hold the request in the wait queue for at most ``max_wait`` seconds."""

    max_wait: Seconds
    reason: str = "queued"
    displaces: tuple[str, Priority] | None = None
    """The tenant and priority whose newest waiter gives up its place to this request
    (refused with ``QUEUE_SHARE``): the queue is full and that tenant holds more of it
    (``share_room``). ``None``: the queue has room."""


@dataclass(frozen=True, slots=True)
class Shed:
    """Refuse the request: HTTP 429 with ``Retry-After: retry_after``."""

    reason: str
    retry_after: Seconds


Admission = Admit | Queue | Shed

_NEARLY_FULL = 0.999

QUEUE_SHARE = "queue_share"
"""The shed reason of a waiter that gave its place to another tenant's request: the queue
was full and its tenant held the most of it (``share_room``)."""

Waiting = Mapping[str, Sequence[int]]
"""Per tenant (``RequestFeatures.tenant``), how many of its requests wait in the queue for
a slot, by priority (indexed by ``int(Priority)``); a tenant with none may be absent."""


def _retry_after(config: AdmissionConfig, queue_depth: int) -> Seconds:
    # A deeper queue means the fleet will take longer to have room again.
    depth = queue_depth / config.queue_size if config.queue_size else 1.0
    return min(config.max_retry_after_s, config.retry_after_s * (1.0 + depth))


def admit(
    config: AdmissionConfig,
    priority: Priority,
    queue_depth: int,
    fleet_saturation: float,
    *,
    tenant: str = "",
    waiting: Waiting | None = None,
) -> Admission:
    """Admit, queue or shed one request (see the module docs for the driver's flow).

    ``fleet_saturation`` is in [0, 1]; 1.0 means no candidate can take the
    request now (every one is full), which is when queueing is considered.
    ``waiting`` is the queue's waiters per tenant (``None``: not shared fairly); a
    full queue may then make room for ``tenant``'s request (``share_room``).
    """
    if priority is _SHEDDABLE and fleet_saturation >= config.sheddable_shed_at:
        return Shed("sheddable_saturated", _retry_after(config, queue_depth))
    if fleet_saturation < 1.0:
        return _ADMIT
    wait = config.max_wait(priority)
    if wait <= 0:
        return Shed("saturated", _retry_after(config, queue_depth))
    if queue_depth >= config.queue_limit(priority):
        victim = share_room(priority, tenant, waiting) if waiting else None
        if victim is None:
            return Shed("queue_full", _retry_after(config, queue_depth))
        return Queue(wait, displaces=victim)
    return Queue(wait)


def share_room(priority: Priority, tenant: str, waiting: Waiting) -> tuple[str, Priority] | None:
    """Whose waiter a request of ``tenant`` at ``priority`` displaces from a full queue:
    (tenant, priority) of that waiter, else ``None`` (the request is refused).

    Longest Queue Drop, as fair switch buffers share memory among flows: the room a
    request competes for is held by waiters no more important than it; the tenant holding
    the most of it gives up its newest waiter at its lowest priority, if it holds at least
    two more than ``tenant`` (one more would only trade places: no fairer, and churn).
    Ties go to the smaller tenant tag, so the choice is deterministic.
    """
    top = int(priority) + 1
    mine = sum(waiting.get(tenant, ())[:top])
    victim: str | None = None
    most = mine + 1  # a victim holds more than this
    for other, counts in waiting.items():
        if other == tenant:
            continue
        held = sum(counts[:top])
        if held > most or (held == most and victim is not None and other < victim):
            victim, most = other, held
    if victim is None:
        return None
    counts = waiting[victim]
    lowest = next(p for p in range(top) if counts[p])
    return victim, Priority(lowest)


def timed_out(config: AdmissionConfig, queue_depth: int) -> Shed:
    """The answer for a request whose queue wait ran out."""
    return Shed("queue_timeout", _retry_after(config, queue_depth))


def displaced(config: AdmissionConfig, queue_depth: int) -> Shed:
    """The answer for a waiter whose place went to another tenant's request (``share_room``)."""
    return Shed(QUEUE_SHARE, _retry_after(config, queue_depth))


def wait_order(priority: Priority, arrival: int) -> tuple[int, int]:
    """Sort key for the wait queue: higher priority first, then first come first served.

    ``arrival`` is the driver's monotonically increasing counter, so ties never
    depend on clock resolution.
    """
    return (-int(priority), arrival)


def fleet_saturation(fleet: FleetSnapshot, kv_saturated: float = 0.95) -> float:
    """How much of the fleet's in-flight capacity is used, in [0, 1].

    A routable worker counts as fully used when it is full or its KV usage is at
    ``kv_saturated``. The result is 1.0 only when no routable worker has a free
    slot, since that alone is what makes queueing (rather than routing) right.
    """
    # One pass with ``routable`` and ``full`` inlined: this runs on every request.
    used = 0.0
    total = 0
    free = False
    for worker in fleet.workers:
        if worker.health not in ROUTABLE_HEALTH:
            continue
        limit = worker.max_in_flight
        total += limit
        if worker.in_flight >= limit:
            used += limit
            continue
        free = True
        kv = worker.kv_usage
        used += limit if kv is not None and kv >= kv_saturated else worker.in_flight
    if not free:
        return 1.0
    share = used / total
    return share if share < _NEARLY_FULL else _NEARLY_FULL
