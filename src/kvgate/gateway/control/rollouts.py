"""The rollout controller loop: judges canaries off the request path and moves weights.

Every ``rollouts.tick_s`` each replica, in one background task:

1. reads the store: model versions (applied to the live registry when they
   differ) and rollouts (so status, windows and sampling follow them);
2. publishes its own outcome windows of each active rollout;
3. takes or renews the controller lease. The holder evaluates each active
   rollout whose ``interval_s`` has passed, on the windows of every replica
   merged, saves the controller, and on a change publishes the new weights
   (``kvgate:model:<model>``); on an alert it posts the webhook.

Manual actions (admin API) run under the same lock as a tick, on the stored
controller, and save it at once. A replica that is not the lease holder may
take them too; the holder picks them up on its next tick (last writer wins
if both write the same rollout within one tick).

The request path never waits on any of this: it reads the registry's current
weights and reports outcomes into the windows (``gateway.outcomes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from kvgate.core.gates import Verdict
from kvgate.core.rollout import RolloutController, RolloutSpec
from kvgate.core.rollout_progress import InvalidTransitionError, RolloutState, RolloutUpdate
from kvgate.core.versions import ModelVersions, VersionWeights
from kvgate.core.window import OutcomeWindow, VersionWindows
from kvgate.gateway.control.alerts import AlertSender
from kvgate.gateway.control.config import RolloutsConfig
from kvgate.gateway.control.outcomes import OutcomeRecorder, Watch
from kvgate.gateway.control.rollout_store import RolloutBlobs
from kvgate.gateway.control.versions import VersionNotFoundError, VersionRegistry
from kvgate.gateway.dataplane.errors import GatewayError, InvalidRequestError, NotFoundError
from kvgate.gateway.observe.metrics import RolloutMetrics
from kvgate.store.base import AffinityStore
from kvgate.tasks import cancel_and_wait

log = logging.getLogger("kvgate.gateway.control.rollouts")

ACTIONS = ("pause", "resume", "promote", "abort")
"""The manual actions ``act`` takes (besides creating a rollout)."""

_FULL_SYNC_EVERY = 30

_HISTORY = 64
"""History entries kept per rollout (the dashboard shows the latest)."""


class RolloutNotFoundError(NotFoundError):
    """404: no rollout with that id."""

    code = "rollout_not_found"


class RolloutConflictError(GatewayError):
    """409: the action does not apply to the rollout's state, or a rollout is in the way."""

    status = 409
    type = "invalid_request_error"
    code = "invalid_transition"


def _replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class RolloutManager:
    """Every rollout this gateway knows, the controller loop, and the manual actions."""

    def __init__(
        self,
        store: AffinityStore,
        registry: VersionRegistry,
        *,
        recorder: OutcomeRecorder,
        alerts: AlertSender,
        metrics: RolloutMetrics,
        config: RolloutsConfig,
        sample_rate: float | None = None,
        clock: Callable[[], float] = time.time,
        replica_id: str | None = None,
    ) -> None:
        self.store = store
        self.blobs = RolloutBlobs(store, config.store_prefix)
        self.registry = registry
        self.recorder = recorder
        self.alerts = alerts
        self.metrics = metrics
        self.config = config
        self.sample_rate = sample_rate
        self.clock = clock
        self.replica = replica_id or _replica_id()
        self.leader = False
        self._controllers: dict[str, RolloutController] = {}
        self.history: dict[str, deque[dict[str, Any]]] = {}
        """What each rollout did, as this replica saw it (bounded; for the dashboard)."""
        self._windows: dict[str, VersionWindows] = {}
        self._syncs = 0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        registry.subscribe(self._weights_changed)
        for versions in registry.models().values():
            self._weights_changed(None, versions)

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Load state from the store, then run the loop in the background."""
        async with self._lock:
            await self._sync()
        self._stop.clear()
        self._task = asyncio.create_task(self._run(), name="kvgate-rollouts")

    async def stop(self) -> None:
        """Stop the loop and give up the lease."""
        self._stop.set()
        await cancel_and_wait(self._task)
        self._task = None
        if self.leader:
            with contextlib.suppress(Exception):
                await self.store.release_lease(self.blobs.lease, self.replica)
            self.leader = False
            self.metrics.leader.set(0)

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("rollout controller tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.config.tick_s)

    async def tick(self) -> None:
        """One round: sync from the store, publish windows, and judge if leader."""
        async with self._lock:
            await self._sync()
            now = self.clock()
            for rollout_id, windows in list(self._windows.items()):
                c = self._controllers[rollout_id]
                own = {v: windows.window(v) for v in (c.spec.baseline, c.spec.canary)}
                await self.blobs.publish_windows(rollout_id, self.replica, now, own)
            ttl = self.config.lease_ttl_s
            self.leader = await self.store.acquire_lease(self.blobs.lease, self.replica, ttl)
            self.metrics.leader.set(1 if self.leader else 0)
            if not self.leader:
                return
            for controller in list(self._controllers.values()):
                if controller.state in (RolloutState.PROGRESSING, RolloutState.PAUSED):
                    await self._evaluate(controller, now)

    # -- reading -----------------------------------------------------------------

    def active_for(self, model: str) -> RolloutController | None:
        """The unfinished rollout of ``model``, if any."""
        for c in self._controllers.values():
            if c.spec.model == model and not c.state.finished:
                return c
        return None

    def statuses(self) -> list[dict[str, Any]]:
        """Every known rollout's status, in creation order."""
        now = self.clock()
        return [self._status(c, now) for c in self._controllers.values()]

    async def status(self, rollout_id: str) -> dict[str, Any]:
        """One rollout's status, fresh from the store (404 if unknown)."""
        async with self._lock:
            c = await self._fresh(rollout_id)
        return self._status(c, self.clock())

    def _status(self, c: RolloutController, now: float) -> dict[str, Any]:
        return {**c.status(now), "leader": self.leader, "replica": self.replica}

    # -- manual actions ------------------------------------------------------------

    async def create(self, spec: RolloutSpec) -> dict[str, Any]:
        """Start a rollout of ``spec`` (400/404/409 when it cannot run)."""
        if not self.config.enabled:
            raise RolloutConflictError("rollouts are disabled (rollouts.enabled: false)")
        self._check_spec(spec)
        async with self._lock:
            await self._sync()
            rollout_id = spec.rollout_id
            existing = self._controllers.get(rollout_id)
            if existing is not None and not existing.state.finished:
                raise RolloutConflictError(f"rollout {rollout_id} exists and is {existing.state}")
            busy = self.active_for(spec.model)
            if busy is not None:
                raise RolloutConflictError(
                    f"model {spec.model!r} already has rollout {busy.spec.rollout_id} "
                    f"({busy.state}); finish or abort it first"
                )
            self._ensure_versions(spec)
            if existing is not None:
                # A re-run of a finished rollout: how the last run ended stays in its history.
                controller = existing.rerun(spec)
                log.info("rollout %s starts again; its last run was %s: %s",
                         rollout_id, existing.state.value, existing.progress.message)  # fmt: skip
            else:
                controller = RolloutController(spec)
            now = self.clock()
            self._controllers[rollout_id] = controller
            self._windows.pop(rollout_id, None)  # a re-run starts with empty windows
            update = controller.start(now)
            await self._commit(controller, update)
            log.info(
                "rollout %s started: %s -> %s, steps %s",
                rollout_id,
                spec.baseline,
                spec.canary,
                list(spec.steps),
            )
            return self._status(controller, now)

    async def act(self, rollout_id: str, action: str, *, full: bool = True) -> dict[str, Any]:
        """Apply ``pause``/``resume``/``promote``/``abort`` (404 unknown, 409 not now).

        ``full=False`` makes ``promote`` move one step instead of all the way.
        """
        if action not in ACTIONS:
            raise NotFoundError(f"no rollout action {action!r}")
        async with self._lock:
            c = await self._fresh(rollout_id)
            now = self.clock()
            try:
                if action == "pause":
                    update = c.pause(now)
                elif action == "resume":
                    update = c.resume(now)
                elif action == "promote":
                    update = c.promote(now, full=full)
                else:
                    update = c.abort(now)
            except InvalidTransitionError as exc:
                raise RolloutConflictError(str(exc)) from None
            await self._commit(c, update)
            log.info("rollout %s: %s by hand, now %s", rollout_id, action, c.state.value)
            return self._status(c, now)

    async def publish_model(self, model: str) -> None:
        """Store ``model``'s current versions so every replica applies them."""
        versions = self.registry.get(model)
        if versions is not None:
            await self.blobs.save_model(versions)

    # -- internals -----------------------------------------------------------------

    def _check_spec(self, spec: RolloutSpec) -> None:
        if spec.gates.quality is not None and self.sample_rate is None:
            raise InvalidRequestError(
                "gates.quality needs a quality evaluator (rollouts.evaluator in the config)",
                param="gates.quality",
            )
        if spec.interval_s < self.config.tick_s:
            log.info(
                "rollout %s: interval_s %.3g is below tick_s %.3g; judged every tick",
                spec.rollout_id,
                spec.interval_s,
                self.config.tick_s,
            )

    def _ensure_versions(self, spec: RolloutSpec) -> None:
        """Register the model's split if needed; 404 for a version nobody serves."""
        known = self.registry.known_versions(spec.model)
        if not known:
            raise NotFoundError(f"no worker serves model {spec.model!r}", code="model_not_found")
        for field in ("baseline", "canary"):
            name = getattr(spec, field)
            if name not in known:
                raise VersionNotFoundError(
                    f"model {spec.model!r} has no version {name!r} "
                    f"(known: {', '.join(sorted(known))})",
                    param=field,
                )
        current = self.registry.get(spec.model)
        if current is None:
            weights = {name: 0.0 for name in known}
            weights[spec.baseline] = 100.0
            current = ModelVersions(spec.model, VersionWeights(weights), spec.baseline)
        else:
            missing = {spec.baseline, spec.canary} - set(current.versions)
            if missing:
                merged = current.weights.to_dict() | dict.fromkeys(missing, 0.0)
                current = ModelVersions(spec.model, VersionWeights(merged), current.stable)
        self.registry.replace(current)

    async def _fresh(self, rollout_id: str) -> RolloutController:
        stored = await self.blobs.load(rollout_id)
        if stored is not None:
            self._adopt(stored)
            return self._controllers[rollout_id]
        known = self._controllers.get(rollout_id)
        if known is None:
            raise RolloutNotFoundError(f"no rollout {rollout_id!r}")
        return known

    async def _sync(self) -> None:
        for model in await self.blobs.model_names():
            versions = await self.blobs.load_model(model)
            if versions is not None:
                self.registry.replace(versions)
        # Finished rollouts rarely change (only when re-run under the same id):
        # re-read them every ``_FULL_SYNC_EVERY`` ticks, not on every one.
        full = self._syncs % _FULL_SYNC_EVERY == 0
        self._syncs += 1
        for rollout_id in await self.blobs.rollout_ids():
            known = self._controllers.get(rollout_id)
            if not full and known is not None and known.state.finished:
                continue
            stored = await self.blobs.load(rollout_id)
            if stored is not None:
                self._adopt(stored)

    def _adopt(self, controller: RolloutController) -> None:
        """Make ``controller`` this replica's view of its rollout (watch it if active)."""
        spec = controller.spec
        rollout_id = spec.rollout_id
        self._controllers[rollout_id] = controller
        self._show(controller)
        if controller.state.finished:
            if self._windows.pop(rollout_id, None) is not None:
                self.recorder.unwatch(spec.model)
            return
        windows = self._windows.get(rollout_id)
        if windows is None:
            window_s = spec.analysis_window_s
            bucket_s = min(self.config.bucket_s, window_s / 10)
            windows = self._windows[rollout_id] = VersionWindows(window_s, bucket_s)
        quality = spec.gates.quality is not None and self.sample_rate is not None
        self.recorder.watch(
            spec.model,
            Watch(
                windows=windows,
                versions=frozenset((spec.baseline, spec.canary)),
                sample_version=spec.canary if quality else None,
                sample_rate=self.sample_rate or 0.0,
            ),
        )

    async def _merged(self, c: RolloutController, now: float) -> VersionWindows:
        """The rollout's windows with every other live replica's added in."""
        spec = c.spec
        own = self._windows.get(spec.rollout_id)
        window_s = spec.analysis_window_s
        bucket_s = min(self.config.bucket_s, window_s / 10)
        merged = VersionWindows(window_s, bucket_s)
        parts: list[dict[str, OutcomeWindow]] = []
        if own is not None:
            parts.append({v: own.window(v) for v in (spec.baseline, spec.canary)})
        parts += await self.blobs.other_windows(spec.rollout_id, self.replica, now - window_s)
        for part in parts:
            for version, window in part.items():
                try:
                    merged.window(version).merge(window)
                except ValueError:
                    log.warning("rollout %s: a replica's window does not match", spec.rollout_id)
        return merged

    async def _evaluate(self, c: RolloutController, now: float) -> None:
        spec = c.spec
        last = c.progress.last_evaluated_at
        if last is not None and now - last < spec.interval_s:
            return
        windows = await self._merged(c, now)
        since = c.analysis_start(now)
        update = c.evaluate(
            now,
            windows.stats(spec.canary, now, since),
            windows.stats(spec.baseline, now, since),
            windows.quality(spec.canary, now, since),
        )
        await self._commit(c, update)

    async def _commit(self, c: RolloutController, update: RolloutUpdate) -> None:
        """Save, publish weights on a change, alert, and refresh this replica's view."""
        spec = c.spec
        rollout_id = spec.rollout_id
        await self.blobs.save(c)
        self.metrics.evaluations.labels(rollout_id, update.reason).inc()
        self._remember(c, update)
        for gate in update.gates:
            if gate.observed is not None:
                self.metrics.gate_value.labels(rollout_id, gate.name).set(gate.observed)
        if update.changed:
            current = self.registry.get(spec.model)
            if current is None:
                self._ensure_versions(spec)
                current = self.registry.get(spec.model)
                assert current is not None
            self.registry.replace(update.apply(current, spec.canary))
            await self.publish_model(spec.model)
        if update.alert is not None:
            alert = update.alert
            if update.state is RolloutState.ROLLED_BACK:
                self.metrics.rollbacks.labels(rollout_id, alert.gate or "").inc()
            self.alerts.send(
                alert,
                {
                    "model": spec.model,
                    "baseline": spec.baseline,
                    "canary": spec.canary,
                    "state": update.state.value,
                    "at": self.clock(),
                },
            )
        self._adopt(c)

    def _remember(self, c: RolloutController, update: RolloutUpdate) -> None:
        """Add ``update`` to the rollout's history unless it only repeats the last entry.

        ``waiting`` (nothing decided yet) is not history; a repeated verdict
        (``inconclusive`` at every tick) is kept once.
        """
        if update.reason == "waiting":
            return
        events = self.history.setdefault(c.spec.rollout_id, deque(maxlen=_HISTORY))
        entry = {
            "at": self.clock(),
            "reason": update.reason,
            "state": update.state.value,
            "step": update.step_index + 1,
            "canary_weight": c.progress.canary_weight,
            "message": c.progress.message,
            "failed": [g.name for g in update.gates if g.verdict is Verdict.FAIL],
        }
        last = events[-1] if events else None
        if last is not None and all(
            last[k] == entry[k] for k in ("reason", "state", "step", "canary_weight")
        ):
            return
        events.append(entry)

    def _show(self, c: RolloutController) -> None:
        rollout_id = c.spec.rollout_id
        for state in RolloutState:
            self.metrics.state.labels(rollout_id, state.value).set(1 if state is c.state else 0)
        self.metrics.step.labels(rollout_id).set(c.progress.step_index + 1)
        self.metrics.canary_weight.labels(rollout_id).set(c.progress.canary_weight)

    def _weights_changed(self, old: ModelVersions | None, new: ModelVersions) -> None:
        total = new.weights.total
        for version, weight in new.weights.items():
            self.metrics.weight.labels(new.model, version).set(100.0 * weight / total)
        if old is not None:
            for gone in set(old.versions) - set(new.versions):
                with contextlib.suppress(KeyError):
                    self.metrics.weight.remove(new.model, gone)
        log.info(
            "model %s: weights %s (stable %s)",
            new.model,
            {v: round(w, 3) for v, w in new.weights.items()},
            new.stable,
        )
