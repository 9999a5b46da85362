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
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from kvgate.core.fleet import ROUTABLE_HEALTH, FleetSnapshot
from kvgate.types import Priority, Seconds


class AdmissionConfig(BaseModel):
    """Limits and waits of admission control (the ``admission:`` config section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    worker_max_in_flight: int = Field(default=256, ge=1)
    queue_size: int = Field(default=1024, ge=0)
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


@dataclass(frozen=True, slots=True)
class Shed:
    """Refuse the request: HTTP 429 with ``Retry-After: retry_after``."""

    reason: str
    retry_after: Seconds


Admission = Admit | Queue | Shed

_NEARLY_FULL = 0.999


def _retry_after(config: AdmissionConfig, queue_depth: int) -> Seconds:
    # A deeper queue means the fleet will take longer to have room again.
    depth = queue_depth / config.queue_size if config.queue_size else 1.0
    return min(config.max_retry_after_s, config.retry_after_s * (1.0 + depth))


def admit(
    config: AdmissionConfig,
    priority: Priority,
    queue_depth: int,
    fleet_saturation: float,
) -> Admission:
    """Admit, queue or shed one request (see the module docs for the driver's flow).

    ``fleet_saturation`` is in [0, 1]; 1.0 means no candidate can take the
    request now (every one is full), which is when queueing is considered.
    """
    if priority is _SHEDDABLE and fleet_saturation >= config.sheddable_shed_at:
        return Shed("sheddable_saturated", _retry_after(config, queue_depth))
    if fleet_saturation < 1.0:
        return _ADMIT
    wait = config.max_wait(priority)
    if wait <= 0:
        return Shed("saturated", _retry_after(config, queue_depth))
    if queue_depth >= config.queue_limit(priority):
        return Shed("queue_full", _retry_after(config, queue_depth))
    return Queue(wait)


def timed_out(config: AdmissionConfig, queue_depth: int) -> Shed:
    """The answer for a request whose queue wait ran out."""
    return Shed("queue_timeout", _retry_after(config, queue_depth))


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
