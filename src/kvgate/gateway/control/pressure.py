"""Memory pressure in the live gateway: watermarks per scrape, migration and offload at hard.

The pure parts live in ``core.pressure``; this module drives them:

- After every scrape (``HealthChecker.scrape_listeners``) the worker's KV usage,
  GPU memory and temperature go into a ``PressureTracker``. Its level becomes
  the worker's ``Pressure`` in the pool, so policies see it: at ``SOFT`` no new
  sessions land there (affine ones stay); at ``HARD`` nothing does. A GPU at
  its drain temperature is marked draining (an admin drain is kept apart, so
  cooling down never ends a drain an operator asked for).
- While a worker is ``HARD`` (at most once per ``relieve_interval_s``), its
  sessions are listed from the store (least recently active first), sized from
  the prompt tokens the gateway last saw for each (a bounded record; an
  estimate when unknown), planned with ``plan_migrations`` and applied: each
  affinity is rewritten with compare-and-set on the old worker, then the old
  worker is asked (``POST offload_endpoint`` with ``{"session_ids": [...]}``)
  to move the moved sessions' KV to its CPU/disk tier rather than drop it.
- Metrics: the pressure level gauge, seconds at or above each watermark,
  preemptions seen, migration rounds, sessions moved and offloads by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvgate.core.decision import Affinity
from kvgate.core.fleet import Pressure
from kvgate.core.pressure import Migration, PressureTracker, SessionLoad, plan_migrations
from kvgate.core.session import PREFIX_KEY_TAG
from kvgate.gateway.config import PressureSettings
from kvgate.gateway.control.offload import SlotPlane
from kvgate.gateway.dataplane.errors import UpstreamError
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.observe.scrape import WorkerSignals
from kvgate.store.base import AffinityStore
from kvgate.tasks import cancel_and_wait
from kvgate.types import Seconds, SessionKey, WorkerId

log = logging.getLogger("kvgate.gateway.control.pressure")

_LEVEL_VALUE = {Pressure.NORMAL: 0, Pressure.SOFT: 1, Pressure.HARD: 2}


class SessionContexts:
    """Each session's last prompt tokens, bounded (least recently updated evicted first)."""

    def __init__(self, limit: int, default_tokens: int) -> None:
        self.limit = limit
        self.default_tokens = default_tokens
        self._tokens: OrderedDict[SessionKey, int] = OrderedDict()
        self._sum = 0

    def __len__(self) -> int:
        return len(self._tokens)

    def record(self, key: SessionKey, tokens: int) -> None:
        """Remember ``key``'s latest prompt size."""
        old = self._tokens.pop(key, None)
        if old is not None:
            self._sum -= old
        self._tokens[key] = tokens
        self._sum += tokens
        while len(self._tokens) > self.limit:
            _, evicted = self._tokens.popitem(last=False)
            self._sum -= evicted

    def tokens(self, key: SessionKey) -> int:
        """``key``'s context in tokens: as last seen, else the mean of those known, else default."""
        known = self._tokens.get(key)
        if known is not None:
            return known
        if self._tokens:
            return max(1, round(self._sum / len(self._tokens)))
        return self.default_tokens


@dataclass(frozen=True, slots=True)
class Move:
    """One session moved: where from and to, why, and whether its KV was offloaded."""

    session_key: SessionKey
    from_worker: WorkerId
    to_worker: WorkerId
    reason: str
    offloaded: bool


class PressureDriver:
    """Feeds scrapes into the pressure tracker and relieves ``HARD`` workers."""

    def __init__(
        self,
        pool: WorkerPool,
        store: AffinityStore,
        metrics: GatewayMetrics,
        settings: PressureSettings,
        *,
        affinity_ttl: Seconds,
        relieve_interval_s: Seconds,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        slots: SlotPlane | None = None,
    ) -> None:
        self.pool = pool
        self.slots = slots
        """Offload for llama.cpp workers (slot save); others get ``POST /kv/offload``."""
        self.store = store
        self.metrics = metrics
        self.settings = settings
        self.ttl = affinity_ttl
        self.relieve_interval_s = settings.relieve_interval_s or relieve_interval_s
        self.wall = wall
        self.mono = mono
        self.tracker = PressureTracker(settings)
        self.contexts = SessionContexts(settings.tracked_sessions, settings.default_context_tokens)
        self.moves: deque[Move] = deque(maxlen=1024)
        """The latest moves, newest last (bounded; for the admin API and tests)."""
        self.admin_drained: set[WorkerId] = set()
        self._hot: set[WorkerId] = set()
        self._exported: dict[tuple[WorkerId, Pressure], float] = {}
        self._preemptions: dict[WorkerId, int] = {}
        self._last_relief: dict[WorkerId, float] = {}
        self._tasks: dict[WorkerId, asyncio.Task[list[Move]]] = {}

    # -- inputs -------------------------------------------------------------------

    def observe(self, worker: Worker, signals: WorkerSignals) -> None:
        """One scrape of ``worker``: update its level, drain flag and metrics; maybe relieve."""
        self._count_preemptions(worker.id, signals.preemptions_total)
        if not self.settings.enabled:
            return
        now = self.mono()
        reading = self.tracker.update(
            worker.id,
            now,
            kv_usage=signals.kv_usage,
            gpu_mem_usage=signals.gpu_mem_usage,
            gpu_temp_c=signals.gpu_temp_c,
        )
        self._export_time(worker.id, now)
        self.metrics.pressure_level.labels(worker.id).set(_LEVEL_VALUE[reading.level])
        if reading.changed:
            rising = _LEVEL_VALUE[reading.level] > _LEVEL_VALUE[worker.pressure] or reading.drain
            log.log(
                logging.WARNING if rising else logging.INFO,
                "worker %s pressure %s -> %s (memory %s, GPU %s °C)%s",
                worker.id,
                worker.pressure,
                reading.level,
                _fmt(reading.usage),
                _fmt(signals.gpu_temp_c),
                " draining: too hot" if reading.drain else "",
            )
        before = worker.pressure, worker.draining
        if reading.level is not worker.pressure:
            worker.update(pressure=reading.level)
        if reading.drain and worker.id not in self._hot:
            self.metrics.drains.labels(worker.id, "temperature").inc()
        self._hot.discard(worker.id)
        if reading.drain:
            self._hot.add(worker.id)
        self._apply_drain(worker)
        if (worker.pressure, worker.draining) != before:
            self.pool.changed()  # queued requests may fit elsewhere, or here again
        if reading.level is Pressure.HARD:
            self._maybe_relieve(worker, now)

    def record_usage(
        self, key: SessionKey, worker: WorkerId, prompt_tokens: int, cached: int | None
    ) -> None:
        """A response's usage: ``key``'s context is now about ``prompt_tokens``."""
        self.contexts.record(key, prompt_tokens)

    def set_admin_drain(self, worker: Worker, drain: bool) -> bool:
        """Drain (or undrain) ``worker`` by hand; True when that changed anything."""
        if drain == (worker.id in self.admin_drained):
            return False
        if drain:
            self.admin_drained.add(worker.id)
            self.metrics.drains.labels(worker.id, "admin").inc()
        else:
            self.admin_drained.discard(worker.id)
        self._apply_drain(worker)
        self.pool.changed()
        log.warning("worker %s %s by the admin API", worker.id, "drained" if drain else "undrained")
        return True

    def _apply_drain(self, worker: Worker) -> None:
        draining = worker.id in self.admin_drained or worker.id in self._hot
        if draining != worker.draining:
            worker.update(draining=draining)

    # -- relief (migration and offload) -------------------------------------------

    def _maybe_relieve(self, worker: Worker, now: float) -> None:
        running = self._tasks.get(worker.id)
        if running is not None and not running.done():
            return
        if now - self._last_relief.get(worker.id, float("-inf")) < self.relieve_interval_s:
            return
        self._last_relief[worker.id] = now
        self._tasks[worker.id] = asyncio.create_task(
            self._relieve_logged(worker), name=f"kvgate-relieve-{worker.id}"
        )

    async def _relieve_logged(self, worker: Worker) -> list[Move]:
        try:
            return await self.relieve(worker)
        except Exception:
            log.exception("relieving worker %s failed", worker.id)
            return []

    async def relieve(self, worker: Worker) -> list[Move]:
        """Plan and apply migrations off ``worker`` (if ``HARD``); the sessions moved."""
        if worker.model is None:
            return []
        snap = self.pool.snapshot(worker.model, self.wall(), self.mono())
        state = snap.get(worker.id)
        if state is None or state.pressure is not Pressure.HARD:
            return []
        if state.kv_usage is None and worker.signals is not None:
            # Degraded (stale) signals are not routed on, but the last reading is
            # still the best idea of how full the worker was.
            state = replace(state, kv_usage=worker.signals.kv_usage)
        try:
            bound: list[Affinity] = await self.store.sessions_of(
                worker.id, self.settings.max_sessions_scanned
            )
        except Exception:
            self.metrics.store_errors.labels("sessions_of").inc()
            log.warning("listing sessions of %s failed", worker.id, exc_info=True)
            return []
        slots = self.slots if self.slots is not None and self.slots.manages(worker) else None
        loads = [
            SessionLoad(
                a.session_key,
                a.last_active,
                self.contexts.tokens(a.session_key),
                slots.move_seconds(a.session_key) if slots is not None else None,
            )
            for a in bound
        ]
        plan = plan_migrations(state, loads, snap, self.settings.migration, self.settings)
        if not plan:
            log.info("worker %s is hard-pressured but no session can move", worker.id)
            return []
        last_active = {a.session_key: a.last_active for a in bound}
        moved = await self._rewrite(plan, last_active)
        if not moved:
            return []
        reason = moved[0].reason
        offloaded = await self._offload(worker, [m.session_key for m in moved], reason)
        moves = [
            Move(m.session_key, m.from_worker, m.to_worker, m.reason, offloaded) for m in moved
        ]
        self.moves.extend(moves)
        self.metrics.migrations.labels(worker.id, reason).inc()
        self.metrics.sessions_moved.labels(worker.id, reason).inc(len(moves))
        log.warning(
            "worker %s %s: moved %d of %d sessions (%s), KV %s",
            worker.id,
            reason,
            len(moves),
            len(bound),
            ", ".join(sorted({m.to_worker for m in moves})),
            "offloaded" if offloaded else "not offloaded",
        )
        self.pool.changed()
        return moves

    async def _rewrite(
        self, plan: list[Migration], last_active: dict[SessionKey, Seconds]
    ) -> list[Migration]:
        """Rebind each planned session with compare-and-set; those this gateway moved."""
        moved: list[Migration] = []
        for m in plan:
            target = self.pool.get(m.to_worker)
            version = target.version if target is not None else "default"
            wanted = Affinity(m.session_key, m.to_worker, version, last_active[m.session_key])
            try:
                bound = await self.store.compare_and_set(
                    m.session_key, m.from_worker, wanted, self.ttl
                )
            except Exception:
                self.metrics.store_errors.labels("compare_and_set").inc()
                log.warning("rebinding %s failed", m.session_key, exc_info=True)
                continue
            # Another request or replica may have moved it first: then it is not ours.
            if bound.worker == m.to_worker:
                moved.append(m)
        return moved

    async def offload_sessions(self, worker: Worker, keys: list[SessionKey], reason: str) -> bool:
        """Ask ``worker`` to keep a copy of these sessions' KV in its offload tier (sessions
        away on a tool call): their KV stays usable on the GPU until evicted, then is
        restored from the copy rather than recomputed (a llama.cpp slot is saved and freed)."""
        return await self._offload(worker, keys, reason, copy=True)

    async def _offload(
        self, worker: Worker, keys: list[SessionKey], reason: str, *, copy: bool = False
    ) -> bool:
        """Ask ``worker`` to move (``copy``: copy) these sessions' KV to its offload tier;
        True if it answered."""
        if not self.settings.offload:
            return False
        if self.slots is not None and self.slots.manages(worker):
            saved = await self.slots.offload(worker, keys)
            self.metrics.offloads.labels(worker.id, reason, "ok" if saved else "error").inc()
            return saved > 0
        # Keys the gateway derived from a prompt are unknown to the worker.
        ids = [k for k in keys if not k.startswith(PREFIX_KEY_TAG)]
        if not ids:
            return False
        ask: dict[str, object] = {"session_ids": ids}
        if copy:
            ask["copy"] = True
        body = json.dumps(ask).encode()
        headers = {"Content-Type": "application/json"}
        if worker.config.api_key:
            headers["Authorization"] = f"Bearer {worker.config.api_key}"
        url = worker.config.offload_endpoint
        try:
            status, answer = await worker.upstream.post_short(
                url, body, self.settings.offload_timeout_s, headers
            )
        except UpstreamError as exc:
            status, answer = 0, str(exc).encode()
        ok = status == 200
        self.metrics.offloads.labels(worker.id, reason, "ok" if ok else "error").inc()
        if not ok:
            log.warning("offload on %s failed (%s): %s", worker.id, status, answer[:200])
            return False
        with contextlib.suppress(ValueError, TypeError, AttributeError, RecursionError):
            blocks = int(json.loads(answer).get("offloaded", 0))
            self.metrics.offloaded_blocks.labels(worker.id).inc(max(0, blocks))
        return True

    # -- metrics ------------------------------------------------------------------

    def _export_time(self, worker: WorkerId, now: float) -> None:
        for level in (Pressure.SOFT, Pressure.HARD):
            total = self.tracker.time_above(worker, level, now)
            delta = total - self._exported.get((worker, level), 0.0)
            if delta > 0:
                self.metrics.pressure_seconds.labels(worker, level.value).inc(delta)
                self._exported[(worker, level)] = total

    def _count_preemptions(self, worker: WorkerId, total: int | None) -> None:
        if total is None:
            return
        previous = self._preemptions.get(worker)
        self._preemptions[worker] = total
        # The first reading and a restarted worker (counter reset) only set the base.
        if previous is not None and total > previous:
            self.metrics.preemptions_seen.labels(worker).inc(total - previous)

    # -- lifecycle ----------------------------------------------------------------

    async def idle(self) -> None:
        """Wait for every relief round in progress (tests, shutdown)."""
        tasks = [t for t in self._tasks.values() if not t.done()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Cancel relief rounds in progress."""
        await cancel_and_wait(*self._tasks.values())
        self._tasks.clear()


def _fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f}"
