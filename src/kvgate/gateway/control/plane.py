"""The gateway's control plane, built in one place: versions, outcomes, rollouts, workers.

``Gateway`` owns one ``ControlPlane``; the router reads ``versions`` on every
request, the proxy reports into ``recorder``, and the admin API drives the
rest. Nothing here is on the request path except those two reads/writes.
"""

from __future__ import annotations

import random

from kvgate.core.policy import Policy
from kvgate.gateway.config import GatewayConfig, WorkerConfig
from kvgate.gateway.control.alerts import AlertSender
from kvgate.gateway.control.evaluator import QualityEvaluator
from kvgate.gateway.control.membership import Membership, WorkerFactory
from kvgate.gateway.control.outcomes import OutcomeRecorder
from kvgate.gateway.control.rollouts import RolloutManager
from kvgate.gateway.control.versions import VersionRegistry
from kvgate.gateway.observe.health import HealthChecker
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.upstream.transport import Timeouts, Upstream
from kvgate.store.base import AffinityStore


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
        policy: Policy,
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
            policy,
            worker_factory(config),
            drain_timeout_s=config.drain_timeout_s,
        )

    @property
    def admin_token(self) -> str | None:
        """The bearer token the admin API requires (``None``: loopback only, open)."""
        return self.config.admin_token

    async def start(self) -> None:
        """Load rollout state from the store and start the background tasks."""
        if self.evaluator is not None:
            self.evaluator.start()
        if self.config.rollouts.enabled:
            await self.rollouts.start()

    async def stop(self) -> None:
        """Stop the background tasks and close their connections."""
        await self.rollouts.stop()
        if self.evaluator is not None:
            await self.evaluator.stop()
        await self.alerts.close()
        await self.membership.close()
