"""The gateway's control plane, built in one place: versions, outcomes, rollouts, workers.

``Gateway`` owns one ``ControlPlane``; the router reads ``versions`` on every
request, the proxy reports into ``recorder``, and the admin API drives the
rest. Nothing here is on the request path except those two reads/writes.
"""

from __future__ import annotations

import json
import logging
import random

from kvgate.gateway.config import GatewayConfig, WorkerConfig
from kvgate.gateway.control.alerts import AlertSender
from kvgate.gateway.control.discovery import Discovery
from kvgate.gateway.control.evaluator import QualityEvaluator
from kvgate.gateway.control.membership import Membership, WorkerFactory
from kvgate.gateway.control.outcomes import OutcomeRecorder
from kvgate.gateway.control.rollouts import RolloutManager
from kvgate.gateway.control.versions import VersionRegistry
from kvgate.gateway.dataplane.errors import GatewayError
from kvgate.gateway.observe.health import HealthChecker
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.routing import Routing
from kvgate.gateway.upstream.transport import Timeouts, Upstream
from kvgate.store.base import AffinityStore

log = logging.getLogger("kvgate.gateway.control.plane")


def worker_factory(config: GatewayConfig) -> WorkerFactory:
    """Builds ``Worker`` objects the way the gateway builds its configured ones."""
    t = config.timeouts
    timeouts = Timeouts(connect=t.connect_s, first_byte=t.first_byte_s, total=t.total_s)
    default_max = config.admission.worker_max_in_flight

    def make(worker: WorkerConfig) -> Worker:
        return Worker(worker, Upstream(worker.url, timeouts), default_max)

    return make


class ControlPlane:
    """Everything that changes how traffic is split, and the admin API's handles on it."""

    def __init__(
        self,
        config: GatewayConfig,
        pool: WorkerPool,
        *,
        store: AffinityStore,
        metrics: GatewayMetrics,
        health: HealthChecker,
        routing: Routing,
    ) -> None:
        self.config = config
        rc = config.rollouts
        self.versions = VersionRegistry(pool, config.models)
        self.recorder = OutcomeRecorder(metrics.rollout, rng=random.Random(config.seed + 1))
        self.alerts = AlertSender(rc.alert_webhook, rc.alert_timeout_s, metrics.rollout)
        self.evaluator: QualityEvaluator | None = None
        if rc.evaluator is not None:
            self.evaluator = QualityEvaluator(
                rc.evaluator, self.recorder.record_score, metrics.rollout
            )
            self.recorder.sink = self.evaluator.submit
        self.blobs = store
        self.rollouts = RolloutManager(
            store,
            self.versions,
            recorder=self.recorder,
            alerts=self.alerts,
            metrics=metrics.rollout,
            config=rc,
            sample_rate=rc.evaluator.sample_rate if rc.evaluator is not None else None,
        )
        self.membership = Membership(
            pool,
            health,
            routing,
            worker_factory(config),
            drain_timeout_s=config.drain_timeout_s,
        )
        self.discovery = Discovery(config.discovery, self.membership)

    @property
    def admin_token(self) -> str | None:
        """The bearer token the admin API requires (``None``: loopback only, open)."""
        return self.config.admin_token

    @property
    def _workers_blob(self) -> str:
        return f"{self.config.rollouts.store_prefix}:workers"

    async def _saved_workers(self) -> dict[str, dict[str, object]]:
        raw = await self.blobs.get_blob(self._workers_blob)
        try:
            saved = json.loads(raw) if raw else {}
        except ValueError:
            log.error("store blob %s is not JSON; ignoring it", self._workers_blob)
            return {}
        return saved if isinstance(saved, dict) else {}

    async def add_worker(self, worker: WorkerConfig) -> Worker:
        """Add a worker for the admin API and save it, so it survives a restart."""
        added = await self.membership.add(worker)
        saved = await self._saved_workers()
        saved[worker.id] = worker.model_dump(mode="json", exclude_defaults=True)
        await self.blobs.put_blob(self._workers_blob, json.dumps(saved).encode())
        return added

    async def remove_worker(self, url: str, *, wait: bool = False) -> Worker:
        """Remove a worker for the admin API and forget it in the store."""
        removed = await self.membership.remove(url, wait=wait)
        saved = await self._saved_workers()
        if saved.pop(url, None) is not None:
            await self.blobs.put_blob(self._workers_blob, json.dumps(saved).encode())
        return removed

    async def _restore_workers(self) -> None:
        """Add the workers the admin API added before a restart (not in the pool yet)."""
        for url, data in (await self._saved_workers()).items():
            if self.membership.pool.get(url) is not None:
                continue
            try:
                await self.membership.add(WorkerConfig.model_validate(data))
            except (ValueError, GatewayError) as exc:
                log.warning("saved worker %s not restored: %s", url, exc)
                continue
            log.info("worker %s restored from the store (added through the admin API)", url)

    async def start(self) -> None:
        """Load rollout state from the store and start the background tasks."""
        await self._restore_workers()
        if self.evaluator is not None:
            self.evaluator.start()
        if self.config.rollouts.enabled:
            await self.rollouts.start()
        self.discovery.start()

    async def stop(self) -> None:
        """Stop the background tasks and close their connections."""
        await self.discovery.stop()
        await self.rollouts.stop()
        if self.evaluator is not None:
            await self.evaluator.stop()
        await self.alerts.close()
        await self.membership.close()
