"""The fleet snapshot: what a policy knows about every worker at one instant."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from kvgate.types import Seconds, WorkerId


class Health(StrEnum):
    """A worker's health as routing sees it (Envoy's vocabulary)."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"  # serving, but a signal is stale or unknown
    EJECTED = "ejected"  # failed checks or outlier detection; takes no traffic
    DRAINING = "draining"  # takes no new sessions; finishes what it has


ROUTABLE_HEALTH = (Health.HEALTHY, Health.DEGRADED)
"""Health levels that take traffic; for loops over the fleet that inline ``routable``."""


class Pressure(StrEnum):
    """Memory pressure level from ``core.pressure`` (soft/hard watermarks)."""

    NORMAL = "normal"
    SOFT = "soft"  # no new sessions
    HARD = "hard"  # move sessions away


@dataclass(frozen=True)
class WorkerState:
    """One worker at one instant.

    ``in_flight`` is the gateway's own accounting (with the other replicas' counts as
    they last published them, ``core.peers``) and is always known; the
    scraped fields are ``None`` when unknown (never scraped, or stale). Frozen,
    without slots: its instance dict lets a driver that caches states rebuild one
    whose only change is its in-flight counts as a copy (``core.routed.reloaded``).
    """

    id: WorkerId
    model: str
    version: str = "default"
    # Defaulted by factories, so the class holds no Enum member by these names: CPython
    # (3.11) does not specialize loads of an attribute the class shadows with an object of
    # a mutable type (an Enum's), and these two are read for every worker of every
    # decision (``base.candidates``), 4x slower unspecialized.
    health: Health = field(default_factory=lambda: Health.HEALTHY)
    pressure: Pressure = field(default_factory=lambda: Pressure.NORMAL)
    in_flight: int = 0
    max_in_flight: int = 256
    sessions: int = 0
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    kv_capacity_tokens: int | None = None
    kv_in_flight_tokens: int = 0
    """The gateway's estimate of the KV tokens its in-flight requests will hold at their end."""
    kv_freed_tokens: int = 0
    """The estimated KV tokens of requests that ended since ``kv_usage`` was scraped."""
    kv_reserved_tokens: int = 0
    """KV tokens of sessions away on a tool call here and expected back (``core.toolcalls``):
    placing other work here evicts them, as it would evict what is in use."""
    gpu_temp_c: float | None = None
    gpu_mem_usage: float | None = None
    slots: int | None = None
    """The engine's batch slots, where it reports them (llama.cpp ``/slots``): a request
    past them waits for one to free."""
    engine_prefill_s: float | None = None
    """The engine's own mean prefill seconds per uncached token (llama.cpp's
    ``prompt_seconds_total / prompt_tokens_total``; ``None``: not reported)."""
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def routable(self) -> bool:
        """True when the worker may take any request at all."""
        return self.health in ROUTABLE_HEALTH

    @property
    def accepts_new_sessions(self) -> bool:
        """True when the worker may take a session it does not already hold."""
        return self.routable and self.pressure is Pressure.NORMAL

    @property
    def full(self) -> bool:
        """True when the gateway's in-flight limit for this worker is reached."""
        return self.in_flight >= self.max_in_flight

    @property
    def load(self) -> int:
        """Requests on the worker: in flight through us plus its own waiting queue."""
        return self.in_flight + (self.waiting or 0)


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """Every worker serving one model, at time ``now`` (the driver's clock)."""

    now: Seconds
    workers: tuple[WorkerState, ...]
    _by_id: dict[WorkerId, WorkerState] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self._by_id.update((w.id, w) for w in self.workers)

    @classmethod
    def indexed(
        cls, now: Seconds, workers: tuple[WorkerState, ...], by_id: dict[WorkerId, WorkerState]
    ) -> FleetSnapshot:
        """A snapshot reusing ``by_id`` as its index instead of building one.

        For a driver that caches the fleet between requests: ``by_id`` must map
        exactly ``workers`` by id, and nobody may change it afterwards (snapshots
        made from the same cache share it).
        """
        snap = object.__new__(cls)
        object.__setattr__(snap, "now", now)
        object.__setattr__(snap, "workers", workers)
        object.__setattr__(snap, "_by_id", by_id)
        return snap

    def get(self, worker_id: WorkerId) -> WorkerState | None:
        """The worker with this id, or ``None``."""
        return self._by_id.get(worker_id)

    def routable(self) -> list[WorkerState]:
        """Workers that may take a request and are not at their in-flight limit."""
        return [w for w in self.workers if w.routable and not w.full]

    def without(self, excluded: frozenset[WorkerId]) -> FleetSnapshot:
        """The same snapshot with some workers removed (e.g. ones a retry already tried)."""
        if not excluded:
            return self
        return FleetSnapshot(self.now, tuple(w for w in self.workers if w.id not in excluded))
