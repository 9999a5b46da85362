"""Worker health: active probes and scrapes on an interval, passive outlier detection.

Every ``interval`` each worker gets ``GET /health`` and, when that passes, a
scrape of its metrics endpoint (and of its DCGM exporter when configured),
mapped through ``parse_worker_metrics`` into the worker's signals with their
time. HAProxy-style ``fall``/``rise`` decides up and down; a worker whose very
first probe fails is down at once. Live request outcomes feed Envoy-style
outlier detection (``core.outlier``), which never ejects more than its
configured share of a model's workers, nor a model's last worker in service;
a passing probe brings an ejected worker back.

Workers configured without a model learn it (and their version, if advertised)
from ``GET /v1/models``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from kvgate.core.outlier import HealthTracker, OutlierConfig, OutlierDetector, Transition
from kvgate.core.slotmap import MAX_SLOTS
from kvgate.gateway.config import HealthConfig
from kvgate.gateway.dataplane.errors import UpstreamError, UpstreamTooLarge
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.observe.scrape import ScrapeError, WorkerSignals, merge, parse_worker_metrics
from kvgate.tasks import cancel_and_wait

log = logging.getLogger("kvgate.gateway.observe.health")

_PARSE_INLINE_BYTES = 64 * 1024
"""Metrics pages up to this size are parsed on the event loop (quicker than a thread
hop); larger ones on a thread, so a big page cannot stall requests."""


class ScrapeListener(Protocol):
    """Told of every successful scrape (the pressure driver listens)."""

    def __call__(self, worker: Worker, signals: WorkerSignals) -> None: ...


class HealthChecker:
    """Probes every worker on an interval and applies live outcomes (outlier detection)."""

    def __init__(
        self,
        pool: WorkerPool,
        config: HealthConfig,
        outlier: OutlierConfig,
        *,
        mono: Callable[[], float] = time.monotonic,
        scrape_listeners: Sequence[ScrapeListener] = (),
        up_listeners: Sequence[Callable[[Worker], None]] = (),
    ) -> None:
        self.pool = pool
        self.config = config
        self.mono = mono
        self.tracker = HealthTracker(config.tracker_config())
        self.outlier = OutlierDetector(outlier)
        self._sync_pools()
        self._probed: set[str] = set()
        self._model_checked: set[str] = set()
        self.model_mismatch: dict[str, str] = {}
        """Worker -> why its configured model is not one it serves (see ``_check_model``)."""
        self.scrape_listeners = tuple(scrape_listeners)
        self.up_listeners = tuple(up_listeners)
        """Told when a worker that probes had taken down is up again (it may have restarted)."""
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._oversized: set[str] = set()
        self._slots: dict[str, int | None] = {}  # llama.cpp's ``GET /slots``, read once

    # -- passive (live requests) ------------------------------------------------

    def success(self, worker: Worker) -> None:
        """A live request on ``worker`` was answered without a server error."""
        self.outlier.record_success(worker.id, self.mono())

    def failure(self, worker: Worker) -> None:
        """A live request on ``worker`` failed by its own fault; may eject it."""
        self._sync_pools()  # a worker's model may have been learned or changed since
        if self.outlier.record_failure(worker.id, self.mono()):
            worker.update(ejected=True)
            log.warning(
                "worker %s ejected after consecutive failures (ejection #%d)",
                worker.id,
                self.outlier.ejection_count(worker.id),
            )
            self.pool.changed()

    def _sync_pools(self) -> None:
        """The outlier share cap counts each model's workers: tell it who serves what."""
        workers = list(self.pool)
        self.outlier.set_workers((w.id for w in workers), {w.id: w.model or "" for w in workers})

    # -- active (probes) --------------------------------------------------------

    async def probe_all(self) -> None:
        """Probe every worker once, concurrently."""
        await asyncio.gather(*(self.probe(w) for w in self.pool))
        self.pool.reindex()

    async def probe(self, worker: Worker) -> None:
        """One active check of ``worker``: health, model discovery, metrics scrape."""
        ok = await self._health_ok(worker)
        if ok and worker.model is None:
            await self._discover(worker)
            ok = worker.model is not None
        elif ok and worker.id not in self._model_checked:
            await self._check_model(worker)
        if ok:
            await self._scrape(worker)
        self._apply_probe(worker, ok)

    def _apply_probe(self, worker: Worker, ok: bool) -> None:
        now = self.mono()
        before = worker.probe_ok, worker.ejected
        if worker.id not in self._probed:
            self._probed.add(worker.id)
            if not ok:
                # No earlier evidence it ever served: down at once, not after ``fall``.
                for _ in range(self.tracker.config.fall):
                    self.tracker.record_probe(worker.id, False, now)
            else:
                self.tracker.record_probe(worker.id, True, now)
        else:
            transition = self.tracker.record_probe(worker.id, ok, now)
            if transition is Transition.DOWN:
                log.warning("worker %s failed %d probes: down", worker.id, self.config.fall)
            elif transition is Transition.UP:
                log.info("worker %s passed %d probes: up", worker.id, self.config.rise)
                for listener in self.up_listeners:
                    listener(worker)
        probe_ok = self.tracker.is_healthy(worker.id)
        if ok and self.outlier.probe_succeeded(worker.id, now):
            log.info("worker %s back from ejection after a passing probe", worker.id)
        ejected = self.outlier.is_ejected(worker.id, now)
        if (probe_ok, ejected) != before:
            worker.update(probe_ok=probe_ok, ejected=ejected)
            self.pool.changed()

    async def _health_ok(self, worker: Worker) -> bool:
        try:
            status, _ = await worker.upstream.get(
                f"{worker.config.url}/health", self.config.timeout_s, self._auth(worker)
            )
        except UpstreamError:
            return False
        return status == 200

    async def _check_model(self, worker: Worker) -> None:
        """Warn once when a worker configured for a model does not list it.

        Left alone, every request for that model would fail with the worker's own
        404; the warning names the fix, and ``/readyz`` shows it (``model_mismatch``).
        """
        try:
            status, body = await worker.upstream.get(
                f"{worker.config.url}/v1/models", self.config.timeout_s, self._auth(worker)
            )
            cards = json.loads(body).get("data") if status == 200 else None
        except (UpstreamError, ValueError, AttributeError, RecursionError):
            return  # try again on the next probe
        self._model_checked.add(worker.id)
        if not isinstance(cards, list):
            return
        served = sorted(str(c.get("id")) for c in cards if isinstance(c, dict) and c.get("id"))
        if served and worker.model not in served:
            self.model_mismatch[worker.id] = (
                f"configured for model {worker.model!r} but serves {served}"
            )
            log.warning(
                "worker %s is configured for model %r but serves %s: requests for %r will "
                "fail there; fix workers[].model (or add a model_aliases entry)",
                worker.id,
                worker.model,
                served,
                worker.model,
            )
        else:
            self.model_mismatch.pop(worker.id, None)

    def forget(self, worker_id: str) -> None:
        """Drop what the checker knows of a removed worker."""
        self._model_checked.discard(worker_id)
        self.model_mismatch.pop(worker_id, None)

    async def _discover(self, worker: Worker) -> None:
        try:
            status, body = await worker.upstream.get(
                f"{worker.config.url}/v1/models", self.config.timeout_s, self._auth(worker)
            )
            cards = json.loads(body).get("data") if status == 200 else None
        except (UpstreamError, ValueError, AttributeError, RecursionError):
            return
        if not isinstance(cards, list) or not cards or not isinstance(cards[0], dict):
            log.warning("worker %s lists no model at /v1/models", worker.id)
            return
        card = cards[0]
        model = card.get("id")
        if not isinstance(model, str) or not model:
            return
        version = card.get("version") or card.get("kvgate_version")
        if worker.config.version is None and isinstance(version, str) and version:
            worker.update(model=model, version=version)
        elif model != worker.model:
            worker.update(model=model)
        log.info("worker %s serves model %r version %r", worker.id, model, worker.version)

    async def _scrape(self, worker: Worker) -> None:
        urls = [worker.config.scrape_url]
        if worker.config.dcgm_url is not None:
            urls.append(worker.config.dcgm_url)
        results = await asyncio.gather(*(self._scrape_one(worker, url) for url in urls))
        if any(r is None for r in results):
            return  # partial data is stale data: keep the previous (ageing) signals
        signals = results[0]
        assert signals is not None
        if len(results) > 1 and results[1] is not None:
            signals = merge(signals, results[1])
        if signals.engine == "llamacpp":
            signals = replace(signals, slots=await self._slot_count(worker))
        routed, generated = worker.routed, signals.generated_total
        before = routed.signals.generated_total if routed.signals is not None else None
        if before is not None and generated is not None and generated > before:
            worker.progress_at = routed.signals_at  # generating since the scrape before this
        worker.replace(routed.scraped(signals, self.mono()))
        for listener in self.scrape_listeners:
            listener(worker, signals)

    async def _scrape_one(self, worker: Worker, url: str) -> WorkerSignals | None:
        cap = self.config.max_scrape_bytes
        try:
            status, body = await worker.upstream.get(url, self.config.timeout_s, max_bytes=cap)
            if status != 200:
                return None
            text = body.decode("utf-8", "replace")
            if len(body) <= _PARSE_INLINE_BYTES:
                return parse_worker_metrics(text, now=time.time())
            # A large page would hold the event loop (every request, every probe) for
            # as long as it parses: parse it on a thread.
            return await asyncio.to_thread(parse_worker_metrics, text, now=time.time())
        except UpstreamTooLarge:
            if worker.id not in self._oversized:
                self._oversized.add(worker.id)  # once per worker, not once per scrape
                log.warning("worker %s: metrics page over %d bytes (health.max_scrape_bytes); "
                            "its scraped signals are unknown", worker.id, cap)  # fmt: skip
            return None
        except (UpstreamError, ScrapeError):
            return None

    async def _slot_count(self, worker: Worker) -> int | None:
        """How many batch slots a llama.cpp worker has (``GET /slots`` lists them). An
        answer is kept: ``None`` if it would not say (a 4xx, e.g. started with
        ``--no-slots``, or a page that is no list); a worker that could not be reached or
        answered 5xx (llama.cpp's 503 while it loads its model) is asked again."""
        if worker.id not in self._slots:
            try:
                status, body = await worker.upstream.get(
                    f"{worker.config.url}/slots", self.config.timeout_s, self._auth(worker),
                    max_bytes=self.config.max_scrape_bytes,
                )  # fmt: skip
            except UpstreamError:
                return None
            if status >= 500:
                return None
            try:
                listed = json.loads(body) if status == 200 else None
            except (ValueError, RecursionError):  # nested past the parser's depth too
                listed = None
            count = len(listed) if isinstance(listed, list) else 0
            self._slots[worker.id] = count if 0 < count <= MAX_SLOTS else None
        return self._slots[worker.id]

    @staticmethod
    def _auth(worker: Worker) -> dict[str, str] | None:
        key = worker.config.api_key
        return {"Authorization": f"Bearer {key}"} if key else None

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        """Start probing on the interval in the background."""
        self._stop.clear()
        self._task = asyncio.create_task(self._run(), name="kvgate-health")

    async def stop(self) -> None:
        """Stop probing."""
        self._stop.set()
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.config.interval_s)
            if self._stop.is_set():
                return
            try:
                await self.probe_all()
            except Exception:
                log.exception("health probe round failed")
