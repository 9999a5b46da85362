"""A worker's routed state as one immutable value, and the pure function that snapshots it.

Everything routing reads about a worker (its model and version, health inputs,
pressure, the gateway's own in-flight accounting, its last scraped readings) is
one frozen ``Routed`` value. A driver never changes it in place: it replaces it
(``dataclasses.replace``), so whoever caches the ``WorkerState`` built from it
knows it changed because the value did, with no list of watched names to keep.

``worker_state`` turns a ``Routed`` into the ``WorkerState`` policies see; the
live pool and the simulator both call it, so the two fleets look the same to
the routing pipeline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Protocol

from kvgate.core.fleet import Health, Pressure, WorkerState
from kvgate.core.pressure import PressureConfig, projected_level
from kvgate.types import Seconds, WorkerId

NEVER = float("-inf")
"""``signals_at`` of a worker never scraped."""

# Enum members as module constants: on 3.11 ``Enum.MEMBER`` goes through
# ``EnumType.__getattr__``'s slot (about 60 ns), and these run on every request.
_HEALTHY = Health.HEALTHY
_DEGRADED = Health.DEGRADED
_DRAINING = Health.DRAINING
_EJECTED = Health.EJECTED


class Readings(Protocol):
    """What routing reads from a worker's scraped metrics (``None`` = unknown)."""

    @property
    def running(self) -> int | None: ...
    @property
    def waiting(self) -> int | None: ...
    @property
    def kv_usage(self) -> float | None: ...
    @property
    def kv_capacity_tokens(self) -> int | None: ...
    @property
    def gpu_temp_c(self) -> float | None: ...
    @property
    def gpu_mem_used_mib(self) -> float | None: ...
    @property
    def gpu_mem_total_mib(self) -> float | None: ...
    @property
    def slots(self) -> int | None: ...
    @property
    def prefill_s_per_token(self) -> float | None: ...
    @property
    def generated_total(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Scraped:
    """A plain ``Readings`` value (the simulator's scrapes; tests)."""

    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    kv_capacity_tokens: int | None = None
    gpu_temp_c: float | None = None
    gpu_mem_used_mib: float | None = None
    gpu_mem_total_mib: float | None = None
    slots: int | None = None
    prefill_s_per_token: float | None = None
    generated_total: int | None = None


@dataclass(frozen=True)
class Routed:
    """One worker as routing knows it between two changes (replace it, never mutate it).

    ``model`` is ``None`` until the worker said which model it serves;
    ``signals_at`` is on the driver's monotonic clock. Frozen, without slots: its
    instance dict lets ``loaded`` copy it in one step (see there).
    """

    id: WorkerId
    model: str | None = None
    version: str = "default"
    max_in_flight: int = 256
    labels: tuple[tuple[str, str], ...] = ()
    probe_ok: bool = False
    ejected: bool = False
    draining: bool = False
    # Defaulted by a factory, so the class holds no Enum member by this name: CPython
    # (3.11) does not specialize loads of an attribute the class shadows with an object
    # of a mutable type (an Enum's), ~250 more instructions a read (``features``).
    pressure: Pressure = field(default_factory=lambda: Pressure.NORMAL)
    in_flight: int = 0
    kv_in_flight_tokens: int = 0
    """KV tokens the requests in flight here will hold at their end (estimated)."""
    signals: Readings | None = None
    signals_at: Seconds = NEVER
    kv_freed_tokens: int = 0
    """KV tokens (estimated) of requests that ended here since ``signals`` were read: the
    scraped use still counts them. A new scrape (``scraped``) starts it again at 0."""
    kv_reserved_tokens: int = 0
    """KV tokens of sessions away on a tool call here, expected back (``core.toolcalls``)."""
    peer_in_flight: int = 0
    """Requests the other gateway replicas have in flight here, as they last published
    (``core.peers``): the snapshot counts them with ours."""
    peer_kv_tokens: int = 0
    """The KV tokens of those requests (``kv_in_flight_tokens``' counterpart)."""

    def scraped(self, signals: Readings, at: Seconds) -> Routed:
        """This value with fresh ``signals`` read at ``at``."""
        return replace(self, signals=signals, signals_at=at, kv_freed_tokens=0)

    def loaded(self, requests: int, kv_tokens: int) -> Routed:
        """This value with ``requests`` more in flight holding ``kv_tokens`` more (or fewer).

        It runs twice per request (lease and release). A frozen dataclass's
        ``__init__`` sets each of the 14 fields through ``object.__setattr__``
        (1.5 us); the new value is made as a copy of this one's instance dict
        with the three counts replaced (0.6 us), before anything can see it.
        """
        new = object.__new__(Routed)
        fields = new.__dict__
        fields.update(self.__dict__)
        fields["in_flight"] = self.in_flight + requests
        kv = self.kv_in_flight_tokens + kv_tokens
        fields["kv_in_flight_tokens"] = kv if kv > 0 else 0
        if kv_tokens < 0:
            fields["kv_freed_tokens"] = self.kv_freed_tokens - kv_tokens
        return new

    def peered(self, requests: int, kv_tokens: int) -> Routed:
        """This value with the other replicas' in-flight counts here (``core.peers``).

        KV they hold no more is freed as our own ended requests' is: the scraped use
        still counts it until the next scrape (``kv_freed_tokens``).
        """
        if requests == self.peer_in_flight and kv_tokens == self.peer_kv_tokens:
            return self
        freed = self.kv_freed_tokens + max(0, self.peer_kv_tokens - kv_tokens)
        return replace(
            self, peer_in_flight=requests, peer_kv_tokens=kv_tokens, kv_freed_tokens=freed
        )


def health_of(worker: Routed, now: Seconds, stale_after: Seconds) -> Health:
    """Health as routing sees it at ``now`` (the clock of ``signals_at``)."""
    if not worker.probe_ok or worker.ejected:
        return _EJECTED
    if worker.draining:
        return _DRAINING
    if worker.signals is None or now - worker.signals_at > stale_after:
        return _DEGRADED
    return _HEALTHY


def state_bounds(worker: Routed, now: Seconds, stale_after: Seconds) -> tuple[Seconds, Seconds]:
    """The times ``(after, until]`` over which ``worker_state(worker, now, ...)`` stays the same.

    Only the age of the signals changes a state with time: fresh ones go stale
    at ``signals_at + stale_after``.
    """
    if worker.signals is None:
        return NEVER, math.inf
    turn = worker.signals_at + stale_after
    return (NEVER, turn) if now <= turn else (turn, math.inf)


def worker_state(
    worker: Routed, now: Seconds, stale_after: Seconds, pressure: PressureConfig | None = None
) -> WorkerState:
    """``worker`` as a ``WorkerState`` for a snapshot at ``now``.

    Stale or missing readings are unknown (``None``), never good; the cache's
    size is configuration, not a reading, so it stays known while stale. With
    ``pressure``, the in-flight KV estimate raises the level (``projected_level``).
    """
    health = health_of(worker, now, stale_after)
    sig = worker.signals
    if health is not _HEALTHY or sig is None:
        state = WorkerState(
            id=worker.id,
            model=worker.model or "",
            version=worker.version,
            health=health,
            pressure=worker.pressure,
            in_flight=worker.in_flight + worker.peer_in_flight,
            max_in_flight=worker.max_in_flight,
            labels=worker.labels,
        )
        kv = worker.kv_in_flight_tokens + worker.peer_kv_tokens
        if sig is not None and kv:
            state = replace(
                state, kv_capacity_tokens=sig.kv_capacity_tokens, kv_in_flight_tokens=kv
            )
            return _projected(state, pressure)
        return state
    mem_usage = None
    if sig.gpu_mem_used_mib is not None and sig.gpu_mem_total_mib:
        mem_usage = sig.gpu_mem_used_mib / sig.gpu_mem_total_mib
    state = WorkerState(
        id=worker.id,
        model=worker.model or "",
        version=worker.version,
        health=health,
        pressure=worker.pressure,
        in_flight=worker.in_flight + worker.peer_in_flight,
        max_in_flight=worker.max_in_flight,
        running=sig.running,
        waiting=sig.waiting,
        kv_usage=sig.kv_usage,
        kv_capacity_tokens=sig.kv_capacity_tokens,
        kv_in_flight_tokens=worker.kv_in_flight_tokens + worker.peer_kv_tokens,
        kv_freed_tokens=worker.kv_freed_tokens,
        kv_reserved_tokens=worker.kv_reserved_tokens,
        gpu_temp_c=sig.gpu_temp_c,
        gpu_mem_usage=mem_usage,
        slots=sig.slots,
        engine_prefill_s=sig.prefill_s_per_token,
        labels=worker.labels,
    )
    return _projected(state, pressure) if state.kv_in_flight_tokens else state


def _projected(state: WorkerState, config: PressureConfig | None) -> WorkerState:
    """``state`` with its pressure raised by the in-flight KV estimate."""
    if config is None:
        return state
    level = projected_level(state.pressure, state, config)
    return state if level is state.pressure else replace(state, pressure=level)


def reloaded(
    base: WorkerState,
    worker: Routed,
    now: Seconds,
    stale_after: Seconds,
    pressure: PressureConfig | None = None,
) -> WorkerState:
    """``worker_state(worker, now, ...)``, given ``base``: the state of a value that
    differed from ``worker`` only in its in-flight counts (``Routed.loaded``, ``peered``).

    The gateway's pool rebuilds a state after every lease and release. A healthy
    worker's state then changes only in the counts and the projected pressure, so
    it is made as a copy of ``base``'s instance dict with those replaced (0.5 us
    rather than a 17-field frozen ``__init__``, 1.5 us); any other health is built
    whole, as ``worker_state`` does.
    """
    if base.health is not _HEALTHY or health_of(worker, now, stale_after) is not base.health:
        return worker_state(worker, now, stale_after, pressure)
    state = object.__new__(WorkerState)
    fields = state.__dict__
    fields.update(base.__dict__)
    fields["pressure"] = worker.pressure
    fields["in_flight"] = worker.in_flight + worker.peer_in_flight
    fields["kv_in_flight_tokens"] = kv = worker.kv_in_flight_tokens + worker.peer_kv_tokens
    fields["kv_freed_tokens"] = worker.kv_freed_tokens
    return _projected(state, pressure) if kv else state
