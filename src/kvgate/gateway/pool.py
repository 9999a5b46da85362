"""The worker pool: every worker the gateway knows, its live state and accounting.

The gateway keeps its own per-worker in-flight count, so routing never waits on
a scrape. Scraped signals carry their age: older than ``stale_after`` they are
reported as unknown (``None``), never as good. A ``FleetSnapshot`` is built per
request from this state; it is a handful of small frozen records.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Protocol

from kvgate.core.fleet import FleetSnapshot, Health, Pressure, WorkerState
from kvgate.core.pressure import PressureConfig, projected_level
from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.metrics import WorkerGaugeRow
from kvgate.gateway.queue import AdmissionQueue
from kvgate.gateway.upstream import Upstream
from kvgate.types import WorkerId

_NEVER = float("-inf")


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
    """One worker: its config, upstream client, health and the gateway's accounting."""

    __slots__ = (
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
        self.stale_after = stale_after
        self.queue = queue
        self._by_model: dict[str, list[Worker]] = {}
        self._pressure_config: PressureConfig | None = None
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
        self.reindex()
        self.changed()

    def remove(self, worker_id: WorkerId) -> Worker | None:
        """Take a worker out of the pool (drain it first); the removed worker or ``None``."""
        worker = self._workers.pop(worker_id, None)
        if worker is not None:
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
        self._by_model = by_model

    def serves(self, model: str) -> bool:
        """True when some worker is configured for or advertised ``model``."""
        return model in self._by_model

    def models(self) -> dict[str, list[str]]:
        """Model name -> the versions its workers serve."""
        return {
            model: sorted({w.version for w in workers})
            for model, workers in sorted(self._by_model.items())
        }

    def snapshot(self, model: str, now_wall: float, now_mono: float) -> FleetSnapshot:
        """The fleet serving ``model`` at this instant."""
        stale = self.stale_after
        workers = self._by_model.get(model, ())
        return FleetSnapshot(now_wall, tuple(w.state(now_mono, stale) for w in workers))

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
        """Per-worker values for the scrape-time gauges."""
        return [
            WorkerGaugeRow(
                worker=w.id,
                model=w.model or "",
                version=w.version,
                in_flight=w.in_flight,
                health=w.health(now_mono, self.stale_after).value,
                ejected=w.ejected,
            )
            for w in self._workers.values()
        ]
