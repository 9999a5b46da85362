"""Memory pressure: per-worker watermark levels, session migration plans, shedding order.

A worker's memory signal is the higher of its KV-cache usage and its GPU memory
usage. Against it, with hysteresis:

- ``NORMAL``: takes anything.
- ``SOFT`` (usage ≥ ``soft_watermark``, 0.85): takes no new sessions.
- ``HARD`` (usage ≥ ``hard_watermark``, 0.95): sessions are moved away.

Levels rise as soon as a threshold is crossed and fall only once usage is below
that threshold minus ``recovery_margin``, so a worker hovering at the mark does
not flap. GPU temperature acts alongside: at ``temp_soft_c`` the worker is held
at ``SOFT``; at ``temp_drain_c`` it is also flagged for draining (the driver
marks it ``DRAINING``); both fall back ``temp_recovery_c`` degrees below.
An unknown signal (never scraped, stale, NaN) keeps the level it had; a worker
never seen before starts ``NORMAL``: missing data never escalates.

Scrapes lag: one admitted request can move KV usage a lot within one scrape
interval, and what preempts is running requests growing their KV during decode once
free blocks run out. So the driver also counts what it sends: each request's KV
demand (``kv_demand_tokens``: its prompt, estimated from its characters, plus a
typical output, never its declared limit) is added to its worker's in-flight
estimate until it ends. ``projected_level`` marks a worker ``SOFT`` as soon as that
estimate reaches the soft mark (new sessions go elsewhere before a scrape shows it),
and ``kv_fits`` is the gate: a request is held at the gateway rather than sent to a
worker that could not start it under the hard mark (its prompt on what the engine
holds or must hold to start what is in flight; output still to grow is the
engine's to handle by preemption until its scrape passes the soft mark).

Example config::

    pressure:
      soft_watermark: 0.85
      hard_watermark: 0.95
      recovery_margin: 0.05
      temp_soft_c: 83
      temp_drain_c: 90
      kv_gate: true
      chars_per_token: 4.0
      default_output_tokens: 256
    migration:
      prefill_tokens_per_s: 8000
      request_service_s: 2.0
      overshoot_penalty_s: 10.0
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import ROUTABLE_HEALTH, FleetSnapshot, Pressure, WorkerState
from kvgate.types import Priority, Seconds, SessionKey, WorkerId

_RANK = {Pressure.NORMAL: 0, Pressure.SOFT: 1, Pressure.HARD: 2}
# Enum members as module constants: on 3.11 ``Enum.MEMBER`` goes through
# ``EnumType.__getattr__``'s slot (about 60 ns), and these run on every request.
_NORMAL = Pressure.NORMAL
_SOFT = Pressure.SOFT


class PressureConfig(BaseModel):
    """Watermarks (fractions of memory) and temperature limits (°C)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    soft_watermark: float = Field(default=0.85, gt=0, le=1)
    hard_watermark: float = Field(default=0.95, gt=0, le=1)
    recovery_margin: float = Field(default=0.05, ge=0, lt=1)
    temp_soft_c: float = 83.0
    temp_drain_c: float = 90.0
    temp_recovery_c: float = Field(default=3.0, ge=0)
    kv_gate: bool = True
    """Hold requests at the gateway while their worker lacks KV headroom for them."""
    chars_per_token: float = Field(default=4.0, gt=0)
    """Prompt characters per token, to estimate a request's KV demand."""
    default_output_tokens: int = Field(default=256, ge=1)
    """A request's output tokens when it sets no ``max_tokens``."""

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.soft_watermark >= self.hard_watermark:
            raise ValueError("soft_watermark must be below hard_watermark")
        if self.temp_soft_c >= self.temp_drain_c:
            raise ValueError("temp_soft_c must be below temp_drain_c")
        return self


@dataclass(frozen=True, slots=True)
class PressureReading:
    """A worker's pressure after one update.

    ``usage`` is the memory signal used (``None`` if unknown this time);
    ``changed`` is True when ``level`` or ``drain`` differ from before.
    """

    level: Pressure
    drain: bool
    usage: float | None
    changed: bool


@dataclass(slots=True)
class _WorkerPressure:
    memory: Pressure = Pressure.NORMAL
    hot: bool = False
    drain: bool = False
    level: Pressure = Pressure.NORMAL
    updated_at: Seconds = 0.0
    above_soft_s: Seconds = 0.0
    above_hard_s: Seconds = 0.0


def memory_signal(kv_usage: float | None, gpu_mem_usage: float | None) -> float | None:
    """The higher of the known memory fractions, or ``None`` if neither is known."""
    known = [u for u in (kv_usage, gpu_mem_usage) if u is not None]
    return max(known) if known else None


class PressureTracker:
    """Per-worker pressure state machine with hysteresis and time-above accounting."""

    def __init__(self, config: PressureConfig | None = None) -> None:
        self.config = config or PressureConfig()
        self._workers: dict[WorkerId, _WorkerPressure] = {}

    def update(
        self,
        worker: WorkerId,
        now: Seconds,
        *,
        kv_usage: float | None = None,
        gpu_mem_usage: float | None = None,
        gpu_temp_c: float | None = None,
    ) -> PressureReading:
        """Feed one scrape's signals for ``worker`` at ``now``; returns the new level."""
        state = self._workers.get(worker)
        if state is None:
            state = self._workers[worker] = _WorkerPressure(updated_at=now)
        self._account(state, now)
        before = (state.level, state.drain)

        usage = memory_signal(kv_usage, gpu_mem_usage)
        if usage is not None:
            state.memory = self._memory_level(state.memory, usage)
        if gpu_temp_c is not None:
            cfg = self.config
            state.drain = gpu_temp_c >= cfg.temp_drain_c or (
                state.drain and gpu_temp_c >= cfg.temp_drain_c - cfg.temp_recovery_c
            )
            state.hot = (
                state.drain
                or gpu_temp_c >= cfg.temp_soft_c
                or (state.hot and gpu_temp_c >= cfg.temp_soft_c - cfg.temp_recovery_c)
            )
        heat = Pressure.SOFT if state.hot else Pressure.NORMAL
        state.level = max(state.memory, heat, key=_RANK.__getitem__)
        return PressureReading(
            level=state.level,
            drain=state.drain,
            usage=usage,
            changed=(state.level, state.drain) != before,
        )

    def observe(self, state: WorkerState, now: Seconds) -> PressureReading:
        """``update`` from a ``WorkerState``'s scraped fields."""
        return self.update(
            state.id,
            now,
            kv_usage=state.kv_usage,
            gpu_mem_usage=state.gpu_mem_usage,
            gpu_temp_c=state.gpu_temp_c,
        )

    def level(self, worker: WorkerId) -> Pressure:
        """The worker's current level (``NORMAL`` if never updated)."""
        state = self._workers.get(worker)
        return state.level if state else Pressure.NORMAL

    def draining(self, worker: WorkerId) -> bool:
        """True while the worker's temperature calls for draining it."""
        state = self._workers.get(worker)
        return state.drain if state else False

    def time_above(self, worker: WorkerId, level: Pressure, now: Seconds) -> Seconds:
        """Seconds ``worker`` has spent at ``level`` or higher, up to ``now``."""
        state = self._workers.get(worker)
        if state is None or level is Pressure.NORMAL:
            return 0.0
        open_s = max(0.0, now - state.updated_at) if _RANK[state.level] >= _RANK[level] else 0.0
        total = state.above_hard_s if level is Pressure.HARD else state.above_soft_s
        return total + open_s

    def forget(self, worker: WorkerId) -> None:
        """``worker`` left the fleet."""
        self._workers.pop(worker, None)

    def _account(self, state: _WorkerPressure, now: Seconds) -> None:
        elapsed = max(0.0, now - state.updated_at)
        if _RANK[state.level] >= _RANK[Pressure.SOFT]:
            state.above_soft_s += elapsed
        if state.level is Pressure.HARD:
            state.above_hard_s += elapsed
        state.updated_at = max(state.updated_at, now)

    def _memory_level(self, previous: Pressure, usage: float) -> Pressure:
        cfg = self.config
        if usage >= cfg.hard_watermark:
            return Pressure.HARD
        target = Pressure.SOFT if usage >= cfg.soft_watermark else Pressure.NORMAL
        if _RANK[target] >= _RANK[previous]:
            return target
        # Falling: leave a level only once usage is a margin below its threshold.
        if previous is Pressure.HARD and usage >= cfg.hard_watermark - cfg.recovery_margin:
            return Pressure.HARD
        if usage >= cfg.soft_watermark - cfg.recovery_margin:
            return Pressure.SOFT
        return Pressure.NORMAL


def kv_demand_tokens(
    request: RequestFeatures, config: PressureConfig, shared_chars: int = 0
) -> int:
    """New KV tokens ``request`` is expected to take: its prompt (its tokens where its
    model has a tokenizer, else from its characters) less the ``shared_chars`` whose KV
    requests in flight on its worker already hold (``Decision.shared_chars``), plus a
    typical output (``default_output_tokens``, less when its ``max_tokens`` is lower).

    Blocks in use are shared in the engine: counting a common preamble again for
    every request in flight that reuses it had the KV gate hold requests on workers
    whose real use was far below the mark.

    A declared ``max_tokens`` is a bound, not a commitment: most requests stop far
    short of it, and counting it in full let one client with a few long-limit
    streams mark every worker ``SOFT`` (and have the fleet shed) while their real
    KV use was near zero. Output that does grow past the typical shows in the
    workers' scraped usage, which ``kv_committed_tokens`` takes when higher.
    """
    # Conditionals, not ``min``/``max`` (keyword parsing on 3.11): this runs per request.
    whole = request.prompt_chars
    shared = shared_chars if shared_chars > 0 else 0
    chars = whole - (whole if whole < shared else shared)
    tokens = len(request.token_ids)
    if tokens and whole:
        # The engine's own count (``tokenizers:``), less the shared part pro rata.
        prompt = math.ceil(tokens * chars / whole)
    else:
        prompt = math.ceil(chars / config.chars_per_token)
    demand = prompt + kv_output_tokens(request, config)
    return demand if demand > 1 else 1


def kv_output_tokens(request: RequestFeatures, config: PressureConfig) -> int:
    """The output part of ``kv_demand_tokens``: a typical output (``default_output_tokens``),
    less when the request's ``max_tokens`` is lower."""
    typical = config.default_output_tokens
    limit = request.max_tokens or typical
    return typical if typical < limit else limit


def kv_committed_tokens(worker: WorkerState) -> float:
    """KV tokens ``worker`` is committed to: the in-flight estimate, or scraped use if higher.

    Scraped use covers work that did not come through this gateway; the
    estimate covers what was sent since the last scrape and the decode growth
    still ahead of running requests. Scraped use is read less what requests that
    ended since the scrape held (``kv_freed_tokens``): after a burst, a scrape
    up to an interval old otherwise kept the KV gate holding requests on a
    worker that had already freed it. 0 with unknown capacity.
    """
    capacity = worker.kv_capacity_tokens
    if not capacity:
        return 0.0
    scraped = (worker.kv_usage or 0.0) * capacity - worker.kv_freed_tokens
    return max(float(worker.kv_in_flight_tokens), scraped)


def projected_usage(worker: WorkerState) -> float | None:
    """``kv_committed_tokens`` as a fraction of capacity; ``None`` with unknown capacity."""
    capacity = worker.kv_capacity_tokens
    return kv_committed_tokens(worker) / capacity if capacity else None


def projected_level(level: Pressure, worker: WorkerState, config: PressureConfig) -> Pressure:
    """``level`` raised to ``SOFT`` when the in-flight estimate reaches the soft mark.

    Never raises to ``HARD``: a worker is hard-pressured on its own scraped
    usage only (which is what moves sessions away); the estimate only keeps
    new sessions off a worker that is about to fill.
    """
    if level is not _NORMAL:
        return level
    capacity = worker.kv_capacity_tokens
    if capacity and worker.kv_in_flight_tokens >= config.soft_watermark * capacity:
        return _SOFT
    return level


def kv_fits(worker: WorkerState, demand: int, config: PressureConfig, output: int = 0) -> bool:
    """True when ``worker`` has KV room to start a request of ``demand`` tokens, ``output``
    of them its expected output (``kv_output_tokens``).

    While the worker's scraped KV use is under the soft mark, the room is what the
    engine needs to admit the request (its demand less its output) under the hard
    mark, against ``kv_started_tokens``: output still to grow is not waited for. An
    engine with free blocks absorbs it, and one that runs out while decoding
    preempts a request and recomputes its uncached tokens, while a hold waits for a
    request to end, a whole decode. Counting every request in flight at its typical
    output held 49 of 128 requests of SGLang's shared-prefix burst (16 x 8, tight
    KV) at the gateway for ~3 s on engines that could start them at once: TTFT p99
    3.3x the peers' rule. Once the scrape shows the engine past the soft mark, its
    growth preempts now: the room is the hard mark less ``kv_committed_tokens`` and
    the whole demand (without that, on the 24 x 10 shape the one worker a pressured
    fleet's scrape showed under the hard mark took every held request at once, ~50
    in flight, and thrashed; a scrape under the soft mark taken before such a flood
    still lets it in).

    Always True with unknown capacity, with the gate off, or when nothing of ours
    is in flight there (a request larger than the headroom runs alone rather than
    never).
    """
    capacity = worker.kv_capacity_tokens
    if not config.kv_gate or not capacity or worker.in_flight == 0:
        return True
    room = config.hard_watermark * capacity
    if (worker.kv_usage or 0.0) >= config.soft_watermark:
        return kv_committed_tokens(worker) + demand <= room
    return kv_started_tokens(worker, config) + demand - output <= room


def kv_started_tokens(worker: WorkerState, config: PressureConfig) -> float:
    """``kv_committed_tokens`` less the output requests in flight are expected to grow:
    the in-flight estimate less a typical output (``default_output_tokens``) per
    request, or scraped use (which holds the output grown so far) if higher."""
    capacity = worker.kv_capacity_tokens
    if not capacity:
        return 0.0
    scraped = (worker.kv_usage or 0.0) * capacity - worker.kv_freed_tokens
    started = worker.kv_in_flight_tokens - worker.in_flight * config.default_output_tokens
    return float(max(started, scraped, 0.0))


class MigrationCostModel(BaseModel):
    """What moving a session costs and what leaving it gains, in seconds.

    Moving a session means its next request recomputes the whole context on the
    target: ``cost = context_tokens / prefill_tokens_per_s``. Leaving it costs
    its next request the pressured worker's queueing: waiting requests ×
    ``request_service_s`` / running requests, plus ``overshoot_penalty_s`` scaled
    by how far usage is past the soft mark (0 at the mark, full at 100%), which
    stands for the preemptions and recomputation an overfull cache causes.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefill_tokens_per_s: float = Field(default=8000.0, gt=0)
    request_service_s: float = Field(default=2.0, ge=0)
    overshoot_penalty_s: float = Field(default=10.0, ge=0)


class SessionLoad(NamedTuple):
    """One session held by a worker, as the store lists it."""

    session_key: SessionKey
    last_active: Seconds
    context_tokens: int
    move_s: Seconds | None = None
    """Seconds to move its KV with it (a llama.cpp slot: save here, restore there), when
    the worker can; ``None``: the target recomputes the context."""


@dataclass(frozen=True, slots=True)
class Migration:
    """Move ``session_key``'s affinity from ``from_worker`` to ``to_worker``."""

    session_key: SessionKey
    from_worker: WorkerId
    to_worker: WorkerId
    reason: str
    expected_gain_s: Seconds
    cost_s: Seconds


@dataclass(slots=True)
class _Target:
    worker: WorkerState
    usage: float
    capacity: float
    load: int


def _queue_delay(worker: WorkerState, cost: MigrationCostModel) -> Seconds:
    return (worker.waiting or 0) * cost.request_service_s / max(1, worker.running or 0)


def plan_migrations(
    worker: WorkerState,
    sessions: Iterable[SessionLoad | tuple[SessionKey, Seconds, int]],
    fleet: FleetSnapshot,
    cost: MigrationCostModel | None = None,
    config: PressureConfig | None = None,
) -> list[Migration]:
    """Which sessions to move off a ``HARD``-pressured ``worker``, and where.

    Cheapest first (smallest context, then idlest), each only if its gain beats
    its cost, each to the least-loaded target that still stays under the soft
    mark after taking it, until the worker's projected usage is under the soft
    mark. Targets must be routable, ``NORMAL`` and below their in-flight limit.

    Usage is projected on KV usage (what moving sessions frees), or GPU memory
    usage when KV is unknown. The worker's capacity in tokens is
    ``kv_capacity_tokens`` when known, else inferred from its sessions' total
    context and its usage; a target of unknown capacity is assumed the same size.
    Returns ``[]`` when the worker is not ``HARD``, its usage is unknown, or no
    target fits.
    """
    cost = cost or MigrationCostModel()
    config = config or PressureConfig()
    if worker.pressure is not Pressure.HARD:
        return []
    usage = worker.kv_usage if worker.kv_usage is not None else worker.gpu_mem_usage
    if usage is None:
        return []
    loads = sorted(
        (SessionLoad(*s) for s in sessions),
        key=lambda s: (s.context_tokens, s.last_active, s.session_key),
    )
    total_tokens = sum(s.context_tokens for s in loads)
    capacity = float(worker.kv_capacity_tokens or 0) or (total_tokens / usage if usage > 0 else 0.0)
    if capacity <= 0:
        return []
    targets = [
        _Target(
            worker=w,
            usage=w.kv_usage if w.kv_usage is not None else (w.gpu_mem_usage or 0.0),
            capacity=float(w.kv_capacity_tokens or 0) or capacity,
            load=w.load,
        )
        for w in fleet.workers
        if w.id != worker.id and w.accepts_new_sessions and not w.full
    ]
    soft = config.soft_watermark
    reason = f"pressure_{worker.pressure}"
    source_queue = _queue_delay(worker, cost)
    plan: list[Migration] = []
    for session in loads:
        if usage < soft:
            break
        fits = [t for t in targets if t.usage + session.context_tokens / t.capacity < soft]
        if not fits:
            continue
        target = min(fits, key=lambda t: (t.load, t.usage, t.worker.id))
        overshoot = max(0.0, usage - soft) / (1.0 - soft) * cost.overshoot_penalty_s
        gain = source_queue + overshoot - _queue_delay(target.worker, cost)
        # Tier-aware: KV that moves with the session costs its transfer, not a recompute.
        move_cost = (
            session.move_s
            if session.move_s is not None
            else session.context_tokens / cost.prefill_tokens_per_s
        )
        if gain <= move_cost:
            continue
        plan.append(
            Migration(
                session_key=session.session_key,
                from_worker=worker.id,
                to_worker=target.worker.id,
                reason=reason,
                expected_gain_s=gain,
                cost_s=move_cost,
            )
        )
        usage -= session.context_tokens / capacity
        target.usage += session.context_tokens / target.capacity
        target.load += 1
    return plan


def fleet_pressure(fleet: FleetSnapshot) -> Pressure:
    """The lowest pressure among routable workers: how pressured the fleet is as a whole.

    ``NORMAL`` when no worker is routable (that is not a pressure matter).
    """
    lowest: Pressure | None = None
    normal = _NORMAL
    for worker in fleet.workers:
        if worker.health not in ROUTABLE_HEALTH:
            continue
        level = worker.pressure
        if level is normal:
            return level  # the lowest there is; the usual case, found at the first worker
        if lowest is None or _RANK[level] < _RANK[lowest]:
            lowest = level
    return lowest if lowest is not None else _NORMAL


def shed_rank(priority: Priority, is_new_session: bool) -> tuple[int, int]:
    """Sort key for what to refuse first: new sessions before affine ones, low priority first."""
    return (0 if is_new_session else 1, int(priority))


def should_shed(priority: Priority, is_new_session: bool, fleet: FleetSnapshot) -> bool:
    """Whether memory pressure calls for refusing this request, by shedding rank.

    Only when no routable worker is ``NORMAL``. Every worker at least ``SOFT``:
    new sessions below ``CRITICAL``. Every worker ``HARD``: all new sessions and
    ``SHEDDABLE`` affine ones; affine standard and critical work continues, as
    its cache is already resident. ``core.route`` sheds only the ``SHEDDABLE`` of
    these (``pressure_<level>`` of ``fleet_pressure``) and places the rest as on an
    unpressured fleet (``unpressured``).
    """
    level = fleet_pressure(fleet)
    if level is _NORMAL:
        return False
    if level is _SOFT:
        return is_new_session and priority < Priority.CRITICAL
    return is_new_session or priority is Priority.SHEDDABLE


def unpressured(fleet: FleetSnapshot) -> FleetSnapshot:
    """``fleet`` with every worker shown unpressured: how a wholly pressured fleet is routed
    (``core.route``), by the policy's own measure, each pick still held for KV room.

    With every routable worker past the soft mark, pressure tells no worker from another:
    shedding new work there refuses what the fleet starts as soon as its KV frees, and
    keeping it off the pressured workers leaves it nowhere to go. On SGLang's shared-prefix
    groups (24 x 10, tight KV: ~20 requests queued in each engine, 98% of KV in use, 2%
    cached-but-free), the fleet-wide shed refused 220 of 1,920 requests over seeds 500-507
    that the peers' engines queued and served (p99 5.5 s); routed as unpressured, none is
    refused, hit -0.30 pt and p99 1.01x the peers'. Waiting at the gateway for a worker to
    fall back under the mark instead served them all at p99 1.61x: it idles the engines
    while they drain. A bound session stays home (another worker would compute its context
    again, on a fleet as short of KV). Sheddable work is still shed there (``should_shed``);
    the KV hold, the in-flight limit and the admission queue (``core.admission``) bound the
    rest.
    """
    normal = _NORMAL
    return FleetSnapshot(
        fleet.now,
        tuple(w if w.pressure is normal else replace(w, pressure=normal) for w in fleet.workers),
    )
