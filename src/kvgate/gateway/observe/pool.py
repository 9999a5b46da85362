"""The worker pool: every worker the gateway knows, its live state and accounting.

The gateway keeps its own per-worker in-flight count, so routing never waits on
a scrape. Scraped signals carry their age: older than ``stale_after`` they are
reported as unknown (``None``), never as good.

Each request gets a ``FleetSnapshot``, but rebuilding every worker's
``WorkerState`` per request costs time in proportion to the fleet. So the pool
keeps each model's (and each version's) states between requests and rebuilds
only what changed: a ``Worker``'s routed state is one immutable value
(``core.routed.Routed``) replaced on every change (its in-flight counts on every
request, health, pressure, a scrape's signals), each replacement marks that
worker for rebuild, and a state whose signals go stale with time is rebuilt
once that time passes. A snapshot then costs one tuple, shared by every request
until the next change. The change every request makes (a lease and its release)
touches only a worker's in-flight counts: the pool notes that, and rebuilds such a
worker's state from its last one (``core.routed.reloaded``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from kvgate.core.fleet import FleetSnapshot, Health, Pressure, WorkerState
from kvgate.core.pressure import PressureConfig
from kvgate.core.routed import (
    NEVER,
    Readings,
    Routed,
    health_of,
    reloaded,
    state_bounds,
    worker_state,
)
from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.dataplane.queue import AdmissionQueue
from kvgate.gateway.observe.metrics import WorkerGaugeRow
from kvgate.gateway.upstream.transport import Upstream
from kvgate.types import WorkerId

ChangeListener = Callable[["Worker", bool], None]
"""Told (worker, membership) when the worker's routed state was replaced."""


class Worker:
    """One worker: its config, upstream client, and its routed state (a ``Routed`` value).

    The routed state is replaced whole (``update``), never changed in place, and
    each replacement tells the pool, so its cached snapshot rebuilds this
    worker's state; nothing routing reads can change without that.
    """

    __slots__ = ("_listener", "_routed", "config", "heard_at", "id", "progress_at", "upstream")

    def __init__(
        self, config: WorkerConfig, upstream: Upstream, default_max_in_flight: int = 256
    ) -> None:
        self._listener: ChangeListener | None = None
        self.heard_at = -math.inf
        """When (monotonic) a request's answer last brought a byte from it: alive then."""
        self.progress_at = -math.inf
        """A scrape at this time (monotonic) was followed by one whose engine had generated
        more tokens (``WorkerSignals.generated_total``): it made progress after then."""
        self.id: WorkerId = config.id  # never the URL's user information
        self.config = config
        self.upstream = upstream
        self._routed = Routed(
            id=self.id,
            model=config.model,
            version=config.version or "default",
            max_in_flight=config.max_in_flight or default_max_in_flight,
            labels=tuple(sorted(config.labels.items())),
        )

    @property
    def routed(self) -> Routed:
        """Everything routing reads about this worker, as one immutable value."""
        return self._routed

    def update(self, **changes: Any) -> None:
        """Replace the routed state with ``changes`` applied (``TypeError`` on an unknown name)."""
        self.replace(replace(self._routed, **changes))

    def replace(self, routed: Routed) -> None:
        """Make ``routed`` this worker's routed state and tell the pool."""
        old = self._routed
        self._routed = routed
        if self._listener is not None:
            self._listener(self, routed.model != old.model or routed.version != old.version)

    def watch(self, listener: ChangeListener | None) -> None:
        """Tell ``listener`` whenever the routed state is replaced (``None``: nobody)."""
        self._listener = listener

    # Read-only views of the routed state, for the code that reports on workers.

    @property
    def model(self) -> str | None:
        """The model it serves (``None`` until it said)."""
        return self._routed.model

    @property
    def version(self) -> str:
        """The model version it serves."""
        return self._routed.version

    @property
    def in_flight(self) -> int:
        """Requests the gateway has in flight here."""
        return self._routed.in_flight

    @property
    def kv_in_flight_tokens(self) -> int:
        """KV tokens the requests in flight here will hold at their end (estimated)."""
        return self._routed.kv_in_flight_tokens

    @property
    def max_in_flight(self) -> int:
        """The gateway's in-flight limit for this worker."""
        return self._routed.max_in_flight

    @property
    def probe_ok(self) -> bool:
        """True when its active health checks pass."""
        return self._routed.probe_ok

    @property
    def ejected(self) -> bool:
        """True while outlier detection keeps it out."""
        return self._routed.ejected

    @property
    def draining(self) -> bool:
        """True while it takes no new sessions (admin drain, hot GPU, removal)."""
        return self._routed.draining

    @property
    def pressure(self) -> Pressure:
        """Its memory-pressure level."""
        return self._routed.pressure

    @property
    def signals(self) -> Readings | None:
        """Its last scraped readings (``None``: never scraped)."""
        return self._routed.signals

    @property
    def signals_at(self) -> float:
        """When ``signals`` were scraped (monotonic clock)."""
        return self._routed.signals_at

    def health(self, now: float, stale_after: float) -> Health:
        """Health as routing sees it; ``now`` is the monotonic clock."""
        return health_of(self._routed, now, stale_after)

    def state(
        self, now: float, stale_after: float, pressure: PressureConfig | None = None
    ) -> WorkerState:
        """This worker as a ``WorkerState`` for a snapshot (``core.routed.worker_state``)."""
        return worker_state(self._routed, now, stale_after, pressure)


class WorkerPool:
    """Every worker, indexed by model, with in-flight accounting and wake-ups."""

    def __init__(
        self,
        workers: list[Worker],
        stale_after: float,
        queue: AdmissionQueue,
        pressure: PressureConfig | None = None,
    ) -> None:
        self._workers = {w.id: w for w in workers}
        self._stale_after = stale_after
        self.queue = queue
        self.pressure = pressure
        """Watermarks the in-flight KV estimate is judged against (``None``: pressure off)."""
        self._by_model: dict[str, list[Worker]] = {}
        self._views: dict[tuple[str, str | None], _View] = {}
        self._views_of: dict[WorkerId, list[_View]] = {}
        self._dirty: dict[Worker, bool] = {}
        """Workers changed since their last rebuild: True if only their in-flight counts did."""
        self._built: dict[WorkerId, WorkerState] = {}
        """Each worker's state as last rebuilt (the base ``reloaded`` copies)."""
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
            self._dirty[worker] = False

    def _forget_views(self) -> None:
        self._views.clear()
        self._views_of.clear()
        self._dirty.clear()
        self._built.clear()

    def _new_view(self, model: str, version: str | None, now: float) -> _View:
        members = self._by_model.get(model, [])
        if version is not None:
            members = [w for w in members if w.version == version]
        view = _View(members, now, self._stale_after, self.pressure)
        self._views[model, version] = view
        for worker in members:
            self._views_of.setdefault(worker.id, []).append(view)
        return view

    def _rebuild_dirty(self, now: float) -> None:
        dirty = list(self._dirty.items())
        self._dirty.clear()
        stale = self._stale_after
        built = self._built
        for worker, loads_only in dirty:
            views = self._views_of.get(worker.id)
            if not views:
                built.pop(worker.id, None)
                continue
            routed = worker.routed
            base = built.get(worker.id) if loads_only else None
            if base is not None:
                state = reloaded(base, routed, now, stale, self.pressure)
            else:
                state = worker_state(routed, now, stale, self.pressure)
            built[worker.id] = state
            after, until = state_bounds(routed, now, stale)
            for view in views:
                view.put(state, after, until)

    def lease(self, worker: Worker, kv_tokens: int = 0) -> Lease:
        """Count a request (holding ``kv_tokens`` of KV at its end) in flight on ``worker``.

        The caller owns the returned lease and must release it on every path
        (``async with lease``, or ``release()`` earlier: it gives back once).
        """
        self._load(worker, 1, kv_tokens)
        return Lease(self, worker, kv_tokens)

    def _load(self, worker: Worker, requests: int, kv_tokens: int) -> None:
        """Change ``worker``'s in-flight counts, noting that nothing else changed."""
        loads_only = self._dirty.get(worker, True)
        worker.replace(worker.routed.loaded(requests, kv_tokens))
        if worker in self._dirty:  # not when it left the pool (nobody listens)
            self._dirty[worker] = loads_only

    def peered(self, worker: Worker, requests: int, kv_tokens: int) -> bool:
        """The other replicas' in-flight counts on ``worker`` (``core.peers``); True when
        they fell (the caller wakes the waiters once for every worker)."""
        old = worker.routed
        routed = old.peered(requests, kv_tokens)
        if routed is old:
            return False
        loads_only = self._dirty.get(worker, True)
        worker.replace(routed)
        if worker in self._dirty:
            self._dirty[worker] = loads_only
        return requests < old.peer_in_flight or kv_tokens < old.peer_kv_tokens

    def _give_back(self, worker: Worker, kv_tokens: int) -> None:
        """A lease on ``worker`` ended: free its slot and KV; wake waiters.

        A request that held KV wakes every waiter: one held for KV headroom on
        this worker may fit now, whoever is first in the queue.
        """
        self._load(worker, -1, -kv_tokens)
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

    __slots__ = (
        "after",
        "bounds",
        "by_id",
        "members",
        "positions",
        "pressure",
        "states",
        "until",
        "workers",
    )

    def __init__(
        self,
        members: list[Worker],
        now: float,
        stale_after: float,
        pressure: PressureConfig | None,
    ) -> None:
        self.members = members
        self.pressure = pressure
        self.positions = {w.id: i for i, w in enumerate(members)}
        self.states: list[WorkerState] = []
        self.bounds: list[tuple[float, float]] = []
        self.by_id: dict[WorkerId, WorkerState] = {}
        self.workers: tuple[WorkerState, ...] | None = None
        self.after = NEVER
        self.until = math.inf
        self.refresh(now, stale_after, everything=True)

    def refresh(self, now: float, stale_after: float, *, everything: bool = False) -> None:
        """Rebuild the states that do not hold at ``now`` (all of them with ``everything``)."""
        if everything:
            pressure = self.pressure
            self.states = [worker_state(w.routed, now, stale_after, pressure) for w in self.members]
            self.bounds = [state_bounds(w.routed, now, stale_after) for w in self.members]
        else:
            for i, (after, until) in enumerate(self.bounds):
                if not after < now <= until:
                    routed = self.members[i].routed
                    self.states[i] = worker_state(routed, now, stale_after, self.pressure)
                    self.bounds[i] = state_bounds(routed, now, stale_after)
        self.by_id = {s.id: s for s in self.states}
        self.workers = None
        self.after = max((b[0] for b in self.bounds), default=NEVER)
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
        # (Conditionals, not ``max``/``min``: those parse keyword arguments, ~700
        # instructions a call on 3.11, at every lease and release.)
        self.after = after if after > self.after else self.after
        self.until = until if until < self.until else self.until


class Lease:
    """One request's slot on a worker (its in-flight count and KV estimate), given back once.

    Taken from ``WorkerPool.lease``. Whoever holds it releases it: ``async with
    lease`` does so on every path, cancellation included; ``release()`` may come
    earlier (a failed attempt frees its slot before the retry's backoff) and
    later calls do nothing. ``move`` carries the slot to another worker (the
    affinity race) without giving it up.
    """

    __slots__ = ("_pool", "held", "kv_tokens", "worker")

    def __init__(self, pool: WorkerPool, worker: Worker, kv_tokens: int) -> None:
        self._pool = pool
        self.worker = worker
        self.kv_tokens = kv_tokens
        self.held = True

    def release(self) -> bool:
        """Give the slot back; True the first time, False once already released."""
        if not self.held:
            return False
        self.held = False
        self._pool._give_back(self.worker, self.kv_tokens)
        return True

    def move(self, worker: Worker) -> None:
        """Hold the slot on ``worker`` instead (the one it held is given back)."""
        if not self.held:
            raise RuntimeError("a released lease cannot move")
        self._pool._give_back(self.worker, self.kv_tokens)
        self._pool._load(worker, 1, self.kv_tokens)
        self.worker = worker

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()
