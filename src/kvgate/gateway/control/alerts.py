"""Rollout alerts: a log line, a metric, and a webhook POST with the alert as JSON.

The webhook is posted from a background task (the controller never waits on
it), retried a few times with a short backoff, and given up after that: an
alert must not stall the controller. The JSON body::

    {"rollout": "llama-3-8b/v3.0", "reason": "gate_failed", "gate": "error_rate",
     "observed": 0.05, "bound": 0.01, "step": 2, "weight": 10.0,
     "message": "...", "model": "llama-3-8b", "baseline": "v2.1", "canary": "v3.0",
     "state": "rolled_back", "at": 1718000000.0}
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from kvgate.core.rollout_progress import Alert, AlertReason
from kvgate.gateway.observe.metrics import RolloutMetrics
from kvgate.tasks import cancel_and_wait

log = logging.getLogger("kvgate.gateway.control.alerts")

_ATTEMPTS = 3
_BACKOFF_S = 0.2


class AlertSender:
    """Logs, counts and posts rollout alerts to the configured webhook."""

    def __init__(self, webhook: str | None, timeout_s: float, metrics: RolloutMetrics) -> None:
        self.webhook = webhook
        self.timeout_s = timeout_s
        self.metrics = metrics
        self._session: aiohttp.ClientSession | None = None
        self._pending: set[asyncio.Task[None]] = set()

    def send(self, alert: Alert, context: Mapping[str, Any]) -> None:
        """Raise ``alert``: log it now, post it in the background."""
        level = logging.INFO if alert.reason is AlertReason.PROMOTED else logging.WARNING
        log.log(level, "rollout alert (%s): %s", alert.reason.value, alert.message)
        if self.webhook is None:
            self.metrics.alerts.labels(alert.rollout, alert.reason.value, "none").inc()
            return
        body = {**alert.model_dump(mode="json"), **context}
        task = asyncio.create_task(self._post(alert, body), name="kvgate-alert")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _post(self, alert: Alert, body: dict[str, Any]) -> None:
        assert self.webhook is not None
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
        for attempt in range(_ATTEMPTS):
            try:
                async with self._session.post(self.webhook, json=body) as resp:
                    if resp.status < 300:
                        self.metrics.alerts.labels(alert.rollout, alert.reason.value, "sent").inc()
                        return
                    problem = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = str(exc) or type(exc).__name__
            if attempt + 1 < _ATTEMPTS:
                await asyncio.sleep(_BACKOFF_S * (attempt + 1))
        self.metrics.alerts.labels(alert.rollout, alert.reason.value, "failed").inc()
        log.error("alert webhook %s failed (%s): %s", self.webhook, problem, alert.message)

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait for alerts being posted (up to ``timeout_s``)."""
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=timeout_s or self.timeout_s)

    async def close(self) -> None:
        """Give pending posts a moment, then cancel them and close connections."""
        await self.flush()
        await cancel_and_wait(*self._pending)
        if self._session is not None:
            await self._session.close()
            self._session = None
