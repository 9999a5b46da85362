"""Adding and removing workers at run time, without a restart or a dropped request.

A new worker is probed once (health, model discovery, scrape) before it can be
picked, like the configured ones at start-up. A removed worker leaves the pool
at once, so no new request goes to it, while requests already on it keep their
own reference and finish; its connections are closed when the last one is
done, or after the drain timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.control.versions import VersionConflictError
from kvgate.gateway.dataplane.errors import NotFoundError
from kvgate.gateway.observe.health import HealthChecker
from kvgate.gateway.observe.kvcache import EngineCaches
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.routing import Routing
from kvgate.tasks import cancel_and_wait
from kvgate.types import WorkerId

log = logging.getLogger("kvgate.gateway.control.membership")

WorkerFactory = Callable[[WorkerConfig], Worker]


class Membership:
    """Which workers the pool holds, changed by the admin API."""

    def __init__(
        self,
        pool: WorkerPool,
        health: HealthChecker,
        routing: Routing,
        make_worker: WorkerFactory,
        *,
        drain_timeout_s: float,
        poll_s: float = 0.05,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.health = health
        self.routing = routing
        self.make_worker = make_worker
        self.drain_timeout_s = drain_timeout_s
        self.poll_s = poll_s
        self.mono = mono
        self._closing: set[asyncio.Task[None]] = set()
        self.caches: EngineCaches | None = None
        """Follows the KV events of workers that publish them (set by the gateway)."""

    async def add(self, config: WorkerConfig) -> Worker:
        """Add and probe a worker; 409 when its URL is already in the pool."""
        worker = self.make_worker(config)
        try:
            self.pool.add(worker)
        except ValueError as exc:
            raise VersionConflictError(str(exc)) from None
        self.health.outlier.set_workers(w.id for w in self.pool)
        if self.caches is not None:
            self.caches.add(config)
        await self.health.probe(worker)
        self.pool.reindex()
        log.info(
            "worker %s added (model %r, version %r, %s)",
            worker.id,
            worker.model,
            worker.version,
            "up" if worker.probe_ok else "down",
        )
        return worker

    async def remove(self, worker_id: WorkerId, *, wait: bool = False) -> Worker:
        """Stop routing to a worker; its in-flight requests finish (``wait``: before returning)."""
        worker = self.pool.get(worker_id)
        if worker is None:
            raise NotFoundError(f"no worker {worker_id!r} in the pool", code="worker_not_found")
        worker.update(draining=True)
        self.pool.remove(worker_id)
        self.health.outlier.forget(worker_id)
        self.health.forget(worker_id)
        self.routing.state.policy.on_worker_removed(worker_id)
        if self.caches is not None:
            await self.caches.remove(worker_id)
        log.info("worker %s removed; %d requests still in flight", worker_id, worker.in_flight)
        task = asyncio.create_task(self._close_when_idle(worker), name=f"kvgate-remove-{worker_id}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        if wait:
            await asyncio.shield(task)
        return worker

    async def _close_when_idle(self, worker: Worker) -> None:
        deadline = self.mono() + self.drain_timeout_s
        try:
            # In-flight counts are plain ints with no wake-up of their own: poll.
            while worker.in_flight > 0 and self.mono() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(self.poll_s)
            if worker.in_flight > 0:
                log.warning(
                    "worker %s: drain timeout, closing with %d in flight",
                    worker.id,
                    worker.in_flight,
                )
        finally:
            await worker.upstream.close()

    async def close(self) -> None:
        """Close every removed worker's connections now (gateway shutdown)."""
        await cancel_and_wait(*self._closing)
