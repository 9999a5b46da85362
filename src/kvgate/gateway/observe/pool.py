"""The worker pool: every worker the gateway knows, its live state and accounting.

The gateway keeps its own per-worker in-flight count, so routing never waits on
a scrape. Scraped signals carry their age: older than ``stale_after`` they are
reported as unknown (``None``), never as good.

Each request gets a ``FleetSnapshot``, but rebuilding every worker's
``WorkerState`` per request costs time in proportion to the fleet. So the pool
keeps each model's (and each version's) states between requests and rebuilds
only what changed: setting any attribute routing reads on a ``Worker`` (its
in-flight counts on every request, health, pressure, a scrape's signals) marks
that worker for rebuild, and a state whose signals go stale with time is rebuilt
once that time passes. A snapshot then costs one tuple, shared by every request
until the next change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Protocol

from kvgate.core.fleet import FleetSnapshot, Health, Pressure, WorkerState
from kvgate.core.pressure import PressureConfig, projected_level
from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.dataplane.queue import AdmissionQueue
from kvgate.gateway.observe.metrics import WorkerGaugeRow
from kvgate.gateway.upstream.transport import Upstream
from kvgate.types import WorkerId

_NEVER = float("-inf")

_ROUTED = frozenset(
    {
        "draining",
        "ejected",
        "in_flight",
        "kv_in_flight_tokens",
        "labels",
        "max_in_flight",
        "model",
        "pressure",
        "pressure_config",
        "probe_ok",
        "signals",
        "signals_at",
        "version",
    }
)
"""``Worker`` attributes ``Worker.state`` reads: setting one invalidates the cached state."""

_MEMBERSHIP = frozenset({"model", "version"})
"""Attributes that decide which model's (and version's) snapshot a worker is in."""

ChangeListener = Callable[["Worker", bool], None]
"""Told (worker, membership) when a routed attribute of the worker was set."""


class Signals(Protocol):
    """What the gateway reads from a worker's scraped metrics (``None`` = unknown)."""

    @property
    def running(self) -> int | None: ...
    @property
    def waiting(self) -> int | None: ...
    @property
    def kv_usage(self) -> float | None: ...
    @property
    def gpu_temp_c(self) -> float | None: ...
    @property
    def gpu_mem_used_mib(self) -> float | None: ...
    @property
    def gpu_mem_total_mib(self) -> float | None: ...


class Worker:
    """One worker: its config, upstream client, health and the gateway's accounting.

    Setting an attribute routing reads tells the pool (so its cached snapshot
    rebuilds this worker's state); ``signals`` are replaced on each scrape, never
    changed in place.
    """

    __slots__ = (
        "_listener",
        "config",
        "draining",
        "ejected",
        "id",
        "in_flight",
        "kv_in_flight_tokens",
        "labels",
        "max_in_flight",
        "model",
        "pressure",
        "pressure_config",
        "probe_ok",
        "signals",
        "signals_at",
        "upstream",
        "version",
    )

    def __init__(
        self, config: WorkerConfig, upstream: Upstream, default_max_in_flight: int = 256
    ) -> None:
        self._listener: ChangeListener | None = None
        self.id: WorkerId = config.url
        self.config = config
        self.upstream = upstream
        self.model: str | None = config.model
        self.version: str = config.version or "default"
        self.max_in_flight = config.max_in_flight or default_max_in_flight
        self.labels = tuple(sorted(config.labels.items()))
        self.in_flight = 0
        self.kv_in_flight_tokens = 0
        """KV tokens the requests in flight here will hold at their end (estimated)."""
        self.pressure_config: PressureConfig | None = None
        """Watermarks for the in-flight KV estimate; ``None`` when pressure handling is off."""
        self.probe_ok = False
        self.ejected = False
        self.draining = False
        self.pressure = Pressure.NORMAL
        self.signals: Signals | None = None
        self.signals_at = _NEVER

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name in _ROUTED and self._listener is not None:
            self._listener(self, name in _MEMBERSHIP)

    def watch(self, listener: ChangeListener | None) -> None:
        """Tell ``listener`` whenever an attribute routing reads is set (``None``: nobody)."""
        self._listener = listener

    def state_bounds(self, now: float, stale_after: float) -> tuple[float, float]:
        """The monotonic times ``(after, until]`` over which ``state(now)`` stays the same.

        Only the age of the signals changes a state with time: fresh ones go
        stale at ``signals_at + stale_after``.
        """
        if self.signals is None:
            return _NEVER, math.inf
        turn = self.signals_at + stale_after
        return (_NEVER, turn) if now <= turn else (turn, math.inf)

    def health(self, now: float, stale_after: float) -> Health:
        """Health as routing sees it; ``now`` is the monotonic clock."""
        if not self.probe_ok or self.ejected:
            return Health.EJECTED
        if self.draining:
            return Health.DRAINING
        if self.signals is None or now - self.signals_at > stale_after:
            return Health.DEGRADED
        return Health.HEALTHY

    def state(self, now: float, stale_after: float) -> WorkerState:
        """This worker as a ``WorkerState`` for a snapshot."""
        health = self.health(now, stale_after)
        sig = self.signals if health is Health.HEALTHY else None
        if sig is None:
            state = WorkerState(
                id=self.id,
                model=self.model or "",
                version=self.version,
                health=health,
                pressure=self.pressure,
                in_flight=self.in_flight,
                max_in_flight=self.max_in_flight,
                labels=self.labels,
            )
            if self.signals is not None and self.kv_in_flight_tokens:
                # The cache's size is configuration, not a reading: it does not go stale.
                capacity = getattr(self.signals, "kv_capacity_tokens", None)
                state = self._projected(
                    replace(
                        state,
                        kv_capacity_tokens=capacity,
                        kv_in_flight_tokens=self.kv_in_flight_tokens,
                    )
                )
            return state
        mem_usage = None
        if sig.gpu_mem_used_mib is not None and sig.gpu_mem_total_mib:
            mem_usage = sig.gpu_mem_used_mib / sig.gpu_mem_total_mib
        state = WorkerState(
            id=self.id,
            model=self.model or "",
            version=self.version,
            health=health,
            pressure=self.pressure,
            in_flight=self.in_flight,
            max_in_flight=self.max_in_flight,
            running=sig.running,
            waiting=sig.waiting,
            kv_usage=sig.kv_usage,
            kv_capacity_tokens=getattr(sig, "kv_capacity_tokens", None),
            kv_in_flight_tokens=self.kv_in_flight_tokens,
            gpu_temp_c=sig.gpu_temp_c,
            gpu_mem_usage=mem_usage,
            labels=self.labels,
        )
        return self._projected(state) if self.kv_in_flight_tokens else state

    def _projected(self, state: WorkerState) -> WorkerState:
        """``state`` with its pressure raised by the in-flight KV estimate (``projected_level``)."""
        config = self.pressure_config
        if config is None:
            return state
        level = projected_level(state.pressure, state, config)
        return state if level is state.pressure else replace(state, pressure=level)


class WorkerPool:
    """Every worker, indexed by model, with in-flight accounting and wake-ups."""

    def __init__(self, workers: list[Worker], stale_after: float, queue: AdmissionQueue) -> None:
        self._workers = {w.id: w for w in workers}
        self._stale_after = stale_after
        self.queue = queue
        self._by_model: dict[str, list[Worker]] = {}
        self._pressure_config: PressureConfig | None = None
        self._views: dict[tuple[str, str | None], _View] = {}
        self._views_of: dict[WorkerId, list[_View]] = {}
        self._dirty: set[Worker] = set()
        for worker in workers:
            worker.watch(self._worker_changed)
        self.reindex()

    def __iter__(self) -> Iterator[Worker]:
        return iter(self._workers.values())

    def __len__(self) -> int:
        return len(self._workers)

    def get(self, worker_id: WorkerId) -> Worker | None:
        """The worker with this id, or ``None``."""
        return self._workers.get(worker_id)

    def add(self, worker: Worker) -> None:
        """Add a worker at run time (``ValueError`` if its id is taken)."""
        if worker.id in self._workers:
            raise ValueError(f"worker {worker.id} is already in the pool")
        worker.pressure_config = self._pressure_config
        self._workers[worker.id] = worker
        worker.watch(self._worker_changed)
        self.reindex()
        self.changed()

    def remove(self, worker_id: WorkerId) -> Worker | None:
        """Take a worker out of the pool (drain it first); the removed worker or ``None``."""
        worker = self._workers.pop(worker_id, None)
        if worker is not None:
            worker.watch(None)
            self.reindex()
            self.changed()
        return worker

    def set_pressure_config(self, config: PressureConfig | None) -> None:
        """Watermarks every worker's in-flight KV estimate is judged against (``None``: off)."""
        self._pressure_config = config
        for worker in self._workers.values():
            worker.pressure_config = config

    def reindex(self) -> None:
        """Rebuild the model index (after model discovery)."""
        by_model: dict[str, list[Worker]] = {}
        for worker in self._workers.values():
            if worker.model is not None:
                by_model.setdefault(worker.model, []).append(worker)
        if by_model != self._by_model:  # the health checker reindexes after every round
            self._by_model = by_model
            self._forget_views()

    @property
    def stale_after(self) -> float:
        """Seconds after which scraped signals count as unknown."""
        return self._stale_after

    @stale_after.setter
    def stale_after(self, seconds: float) -> None:
        self._stale_after = seconds
        self._forget_views()

    def serves(self, model: str) -> bool:
        """True when some worker is configured for or advertised ``model``."""
        return model in self._by_model

    def models(self) -> dict[str, list[str]]:
        """Model name -> the versions its workers serve."""
        return {
            model: sorted({w.version for w in workers})
            for model, workers in sorted(self._by_model.items())
        }

    def snapshot(
        self, model: str, now_wall: float, now_mono: float, version: str | None = None
    ) -> FleetSnapshot:
        """The fleet serving ``model`` at this instant; with ``version``, only its workers.

        Built from the cached states (see the module docs): only workers changed
        since the last snapshot, or whose signals went stale since, are rebuilt.
        """
        if self._dirty:
            self._rebuild_dirty(now_mono)
        view = self._views.get((model, version))
        if view is None:
            view = self._new_view(model, version, now_mono)
        elif not view.after < now_mono <= view.until:
            view.refresh(now_mono, self._stale_after)
        workers = view.workers
        if workers is None:
            workers = view.workers = tuple(view.states)
        return FleetSnapshot.indexed(now_wall, workers, view.by_id)

    def _worker_changed(self, worker: Worker, membership: bool) -> None:
        if membership:
            self._forget_views()
        else:
            self._dirty.add(worker)

    def _forget_views(self) -> None:
        self._views.clear()
        self._views_of.clear()
        self._dirty.clear()

    def _new_view(self, model: str, version: str | None, now: float) -> _View:
        members = self._by_model.get(model, [])
        if version is not None:
            members = [w for w in members if w.version == version]
        view = _View(members, now, self._stale_after)
        self._views[model, version] = view
        for worker in members:
            self._views_of.setdefault(worker.id, []).append(view)
        return view

    def _rebuild_dirty(self, now: float) -> None:
        dirty = list(self._dirty)
        self._dirty.clear()
        stale = self._stale_after
        for worker in dirty:
            views = self._views_of.get(worker.id)
            if not views:
                continue
            state = worker.state(now, stale)
            after, until = worker.state_bounds(now, stale)
            for view in views:
                view.put(state, after, until)

    def acquire(self, worker: Worker, kv_tokens: int = 0) -> None:
        """Count a request (holding ``kv_tokens`` of KV at its end) as in flight on ``worker``."""
        worker.in_flight += 1
        worker.kv_in_flight_tokens += kv_tokens

    def release(self, worker: Worker, kv_tokens: int = 0) -> None:
        """A request on ``worker`` finished: free its slot and KV; wake waiters.

        A request that held KV wakes every waiter: one held for KV headroom on
        this worker may fit now, whoever is first in the queue.
        """
        worker.in_flight -= 1
        worker.kv_in_flight_tokens = max(0, worker.kv_in_flight_tokens - kv_tokens)
        if kv_tokens:
            self.queue.wake_all()
        else:
            self.queue.wake_one()

    def changed(self) -> None:
        """A worker's routability changed: every waiter tries again."""
        self.queue.wake_all()

    def in_flight(self) -> int:
        """Requests in flight on every worker."""
        return sum(w.in_flight for w in self._workers.values())

    def gauge_rows(self, now_mono: float) -> list[WorkerGaugeRow]:
        """Per-worker values for the scrape-time gauges and the dashboard."""
        # A copy: /metrics renders in a thread while the loop may add or remove workers.
        return [self._gauge_row(w, now_mono) for w in list(self._workers.values())]

    def _gauge_row(self, w: Worker, now: float) -> WorkerGaugeRow:
        stale = self.stale_after
        state = w.state(now, stale)
        sig = w.signals
        age = now - w.signals_at if sig is not None else None
        return WorkerGaugeRow(
            worker=w.id,
            model=w.model or "",
            version=w.version,
            in_flight=w.in_flight,
            health=state.health.value,
            ejected=w.ejected,
            max_in_flight=w.max_in_flight,
            pressure=state.pressure.value,
            kv_in_flight_tokens=w.kv_in_flight_tokens,
            running=sig.running if sig is not None else None,
            waiting=sig.waiting if sig is not None else None,
            kv_usage=sig.kv_usage if sig is not None else None,
            kv_capacity_tokens=state.kv_capacity_tokens,
            gpu_temp_c=sig.gpu_temp_c if sig is not None else None,
            gpu_mem_used_mib=sig.gpu_mem_used_mib if sig is not None else None,
            gpu_mem_total_mib=sig.gpu_mem_total_mib if sig is not None else None,
            scrape_age_s=age,
            signals_fresh=age is not None and age <= stale,
        )


class _View:
    """The cached states of one model's (or one version's) workers, in pool order.

    ``by_id`` and ``workers`` are shared with the snapshots made from them, so a
    change replaces them (copy on write) rather than changing them.
    """

    __slots__ = ("after", "bounds", "by_id", "members", "positions", "states", "until", "workers")

    def __init__(self, members: list[Worker], now: float, stale_after: float) -> None:
        self.members = members
        self.positions = {w.id: i for i, w in enumerate(members)}
        self.states: list[WorkerState] = []
        self.bounds: list[tuple[float, float]] = []
        self.by_id: dict[WorkerId, WorkerState] = {}
        self.workers: tuple[WorkerState, ...] | None = None
        self.after = _NEVER
        self.until = math.inf
        self.refresh(now, stale_after, everything=True)

    def refresh(self, now: float, stale_after: float, *, everything: bool = False) -> None:
        """Rebuild the states that do not hold at ``now`` (all of them with ``everything``)."""
        if everything:
            self.states = [w.state(now, stale_after) for w in self.members]
            self.bounds = [w.state_bounds(now, stale_after) for w in self.members]
        else:
            for i, (after, until) in enumerate(self.bounds):
                if not after < now <= until:
                    worker = self.members[i]
                    self.states[i] = worker.state(now, stale_after)
                    self.bounds[i] = worker.state_bounds(now, stale_after)
        self.by_id = {s.id: s for s in self.states}
        self.workers = None
        self.after = max((b[0] for b in self.bounds), default=_NEVER)
        self.until = min((b[1] for b in self.bounds), default=math.inf)

    def put(self, state: WorkerState, after: float, until: float) -> None:
        """Replace one worker's state (rebuilt after a change)."""
        i = self.positions[state.id]
        self.states[i] = state
        self.bounds[i] = (after, until)
        if self.workers is not None:
            # A snapshot holds the current index: the next one gets a copy.
            self.by_id = dict(self.by_id)
            self.workers = None
        self.by_id[state.id] = state
        # Only ever narrowed here; ``refresh`` recomputes them exactly when passed.
        self.after = max(self.after, after)
        self.until = min(self.until, until)
