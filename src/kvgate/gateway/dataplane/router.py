"""The stateful routing seam: store lookup, policy pick, admission, affinity write.

Per request: features -> (if it has an affinity key) ``store.get`` -> ``policy.pick``
on a fresh snapshot -> if every worker is at its in-flight limit, wait in the
bounded admission queue up to the priority's max wait, else 429 -> apply the
decision: count the request in flight, ``compare_and_set`` the affinity (if
another replica won, follow the binding in force when it is routable), and tell
the policy. After the response: ``policy.on_usage`` and ``store.touch``.

The store is advisory: its errors are counted and logged, never fail a request.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvgate.core.admission import (
    AdmissionConfig,
    Admit,
    Queue,
    Shed,
    admit,
    fleet_saturation,
    timed_out,
)
from kvgate.core.decision import Affinity, Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import WorkerState
from kvgate.core.holders import (
    HOLDER_TTL_S,
    continues,
    holder_writes,
    holders_from,
    lookup_keys,
)
from kvgate.core.policy import Policy, RouteContext
from kvgate.core.pressure import (
    PressureConfig,
    fleet_pressure,
    kv_demand_tokens,
    kv_fits,
    overflow_decision,
    should_shed,
)
from kvgate.gateway.control.versions import VersionRegistry
from kvgate.gateway.dataplane.errors import NoHealthyWorkerError, OverloadedError
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.types import BlockHash, Priority, Seconds, SessionKey, WorkerId

CAPACITY_FULL = "capacity_full"
"""The reason a policy gives when every candidate is at its in-flight limit."""

log = logging.getLogger("kvgate.gateway.dataplane.router")


class AffinityStoreLike(Protocol):
    """The part of ``kvgate.store.AffinityStore`` the router uses."""

    async def get(self, key: SessionKey) -> Affinity | None: ...

    async def compare_and_set(
        self,
        key: SessionKey,
        expected_worker: WorkerId | None,
        affinity: Affinity,
        ttl: Seconds,
    ) -> Affinity: ...

    async def touch(self, key: SessionKey, now: Seconds, ttl: Seconds) -> object: ...

    async def get_holders(self, blocks: Sequence[BlockHash]) -> list[WorkerId | None]: ...

    async def set_holders(
        self, entries: Sequence[tuple[BlockHash, WorkerId]], ttl: Seconds
    ) -> None: ...


@dataclass(slots=True)
class Placement:
    """Where one attempt of a request went, after the decision was applied."""

    worker: Worker
    reason: str
    version: str
    queued_s: float = 0.0
    wrote_affinity: bool = False
    bound: Affinity | None = None
    """The binding in force after this attempt's write (a retry expects it)."""
    kv_tokens: int = 0
    """The KV demand counted in flight on ``worker`` (given back on release)."""


@dataclass(slots=True)
class _Held:
    """How long one request has been held at the gateway for KV headroom."""

    priority: Priority
    since: float | None = None
    seconds: float = 0.0


class Router:
    """Turns request features into a placed, counted attempt on one worker."""

    def __init__(
        self,
        pool: WorkerPool,
        policy: Policy,
        store: AffinityStoreLike,
        metrics: GatewayMetrics,
        admission: AdmissionConfig,
        *,
        affinity_ttl: Seconds,
        rng: random.Random,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        versions: VersionRegistry | None = None,
    ) -> None:
        self.pool = pool
        self.versions = versions
        """Model versions: a split model's request sees only its assigned version's workers."""
        self.policy = policy
        self.store = store
        self.metrics = metrics
        self.admission = admission
        self.ttl = affinity_ttl
        self.rng = rng
        self.wall = wall
        self.mono = mono
        self.kv_gate: PressureConfig | None = None
        """Watermarks for holding requests until their worker has KV headroom (None: off)."""
        self.kv_gate_max_wait_s = 10.0
        """Longest a request is held for KV headroom; then it is sent anyway."""
        self.kv_holds = 0
        """Requests held at least once for KV headroom (for benchmarks and tests)."""
        self.usage_listeners: list[Callable[[SessionKey, int], None]] = []
        """Told each finished session's prompt tokens (the pressure driver's context sizes)."""

    async def lookup(self, features: RequestFeatures) -> Affinity | None:
        """The store's binding for the request's affinity key (``None`` on miss or error)."""
        key = features.affinity_key
        if key is None:
            return None
        try:
            found = await self.store.get(key)
        except Exception:
            self._store_failed("get")
            self.metrics.affinity.labels("error").inc()
            return None
        m = self.metrics
        m.child(m.affinity, "hit" if found is not None else "miss").inc()
        return found

    async def place(
        self,
        features: RequestFeatures,
        affinity: Affinity | None,
        excluded: frozenset[WorkerId] = frozenset(),
    ) -> Placement:
        """Pick a worker (waiting in the admission queue if all are full) and apply it.

        Raises ``NoHealthyWorkerError`` (503) or ``OverloadedError`` (429).
        """
        queue = self.pool.queue
        cfg = self.admission
        priority = features.priority
        queued_at: float | None = None
        deadline = 0.0
        version = self.versions.assign(features, affinity) if self.versions is not None else None
        gate = self.kv_gate
        demand = kv_demand_tokens(features, gate) if gate is not None else 0
        held = _Held(priority)
        keys, seen, holders = await self._holders(features, affinity)
        while True:
            snap = self.pool.snapshot(features.model, self.wall(), self.mono(), version)
            snap = snap.without(excluded)
            if not any(w.routable for w in snap.workers):
                raise NoHealthyWorkerError(f"no healthy worker serves model {features.model!r}")
            fresh = affinity is None and not continues(len(features.prefix_hashes), holders)
            if should_shed(priority, fresh, snap):
                # Every worker is memory-pressured: new and low-priority work goes first.
                raise self._shed(features, f"pressure_{fleet_pressure(snap)}", cfg.retry_after_s)
            verdict = admit(cfg, priority, len(queue), fleet_saturation(snap, cfg.kv_saturated))
            if isinstance(verdict, Admit):
                context = RouteContext(snap, affinity, self.rng, holders)
                decision = self.policy.pick(features, context)
                if decision.reason == CAPACITY_FULL:
                    decision = overflow_decision(features, affinity, snap) or decision
                if decision.worker is not None:
                    worker = self.pool.get(decision.worker)
                    if worker is not None:
                        state = snap.get(worker.id)
                        if state is None or not await self._hold_for_kv(state, demand, held):
                            break
                        continue
                    log.error("policy picked unknown worker %s", decision.worker)
                    decision = Decision.refuse("invalid_decision")
                if decision.reason != CAPACITY_FULL:
                    # Shed for the policy's own reasons (pressure, priority): no queueing.
                    raise self._shed(features, decision.reason, decision.retry_after)
                verdict = admit(cfg, priority, len(queue), 1.0)
            if isinstance(verdict, Shed):
                raise self._shed(features, verdict.reason, verdict.retry_after)
            assert isinstance(verdict, Queue)  # admit() at full saturation never admits
            # Queue: every routable worker is at its in-flight limit; wait for a slot.
            now = self.mono()
            if queued_at is None:
                queued_at = now
                deadline = now + verdict.max_wait
            if not await queue.wait(priority, deadline - now):
                self._observe_wait(priority, self.mono() - queued_at)
                late = timed_out(cfg, len(queue))
                raise self._shed(features, late.reason, late.retry_after)

        queued_s = 0.0
        if queued_at is not None:
            queued_s = self.mono() - queued_at
            self._observe_wait(priority, queued_s)
        queued_s += held.seconds
        self.pool.acquire(worker, demand)
        placement = Placement(
            worker=worker,
            reason=decision.reason,
            version=decision.version or worker.version,
            queued_s=queued_s,
            kv_tokens=demand,
        )
        if decision.affinity is not None:
            await self._bind(features, decision, placement, excluded)
        self.policy.on_routed(features, placement.worker.id, self.wall())
        if keys:
            await self._share_holders(keys, seen, placement.worker.id)
        return placement

    async def _holders(
        self, features: RequestFeatures, affinity: Affinity | None
    ) -> tuple[list[BlockHash], list[WorkerId | None], Mapping[WorkerId, int]]:
        """The shared prefix state for a request that follows no binding (``core.holders``).

        Returns the checkpoint blocks looked up, what the store had for each, and
        per worker the deepest of them it holds. A request bound to a session
        needs none of it; a store error means no evidence, never a failure.
        """
        keys = lookup_keys(features.prefix_hashes, features.checkpoints, affinity is not None)
        if not keys:
            return [], [], {}
        try:
            seen = await self.store.get_holders(keys)
        except Exception:
            self._store_failed("get_holders")
            return keys, [None] * len(keys), {}
        return keys, seen, holders_from(features.checkpoints, seen)

    async def _share_holders(
        self, keys: list[BlockHash], seen: list[WorkerId | None], worker: WorkerId
    ) -> None:
        """Tell other replicas where this request's checkpoint blocks went."""
        writes = holder_writes(keys, seen, worker)
        if not writes:
            return
        try:
            await self.store.set_holders(writes, min(self.ttl, HOLDER_TTL_S))
        except Exception:
            self._store_failed("set_holders")

    async def _bind(
        self,
        features: RequestFeatures,
        decision: Decision,
        place: Placement,
        excluded: frozenset[WorkerId],
    ) -> None:
        """Write the decision's affinity; follow another replica's binding if it won."""
        write = decision.affinity
        assert write is not None
        wanted = Affinity(write.session_key, write.worker, write.version, self.wall())
        try:
            bound = await self.store.compare_and_set(
                write.session_key, write.expected, wanted, self.ttl
            )
        except Exception:
            self._store_failed("compare_and_set")
            return
        place.wrote_affinity = True
        place.bound = bound
        if bound.worker == place.worker.id or bound.worker in excluded:
            return
        other = self.pool.get(bound.worker)
        if other is None or other.model != features.model:
            return
        state = other.state(self.mono(), self.pool.stale_after)
        if state.routable and not state.full:
            self.pool.release(place.worker, place.kv_tokens)
            self.pool.acquire(other, place.kv_tokens)
            place.worker = other
            place.version = bound.version or other.version
            place.reason = "affinity_race"

    async def _hold_for_kv(self, state: WorkerState, demand: int, held: _Held) -> bool:
        """Wait for a release when ``state`` lacks KV headroom for ``demand``; True if it waited.

        Sending would make the worker's running requests outgrow its KV cache and
        be preempted (recomputed); holding here keeps the request's cache where
        it is. Past ``kv_gate_max_wait_s`` (or with a full wait queue) the
        request is sent anyway: the gate delays, it never refuses.
        """
        gate = self.kv_gate
        if gate is None or kv_fits(state, demand, gate):
            return False
        now = self.mono()
        if held.since is None:
            held.since = now
            self.kv_holds += 1
        left = held.since + self.kv_gate_max_wait_s - now
        if left <= 0:
            return False
        # A release (or a scrape that changes a worker's level) wakes every waiter.
        woken = await self.pool.queue.wait(held.priority, left)
        held.seconds = self.mono() - held.since
        return woken

    def _observe_wait(self, priority: Priority, seconds: float) -> None:
        self.metrics.queue_wait.labels(priority.name.lower()).observe(seconds)

    def _shed(
        self, features: RequestFeatures, reason: str, retry_after: float | None
    ) -> OverloadedError:
        self.metrics.sheds.labels(reason, features.priority.name.lower()).inc()
        return OverloadedError(
            f"the fleet serving {features.model!r} is overloaded ({reason}); retry later",
            retry_after=retry_after or 1.0,
            reason=reason,
        )

    async def finished(
        self,
        features: RequestFeatures,
        placement: Placement,
        prompt_tokens: int | None,
        cached_tokens: int | None,
    ) -> None:
        """After the response: cache feedback to the policy and refresh the affinity TTL."""
        now = self.wall()
        if prompt_tokens is not None:
            self.policy.on_usage(
                features, placement.worker.id, prompt_tokens, cached_tokens or 0, now
            )
        key = features.affinity_key
        if key is not None and prompt_tokens is not None:
            for listener in self.usage_listeners:
                listener(key, prompt_tokens)
        if key is not None and not placement.wrote_affinity:
            try:
                await self.store.touch(key, now, self.ttl)
            except Exception:
                self._store_failed("touch")

    def _store_failed(self, op: str) -> None:
        self.metrics.store_errors.labels(op).inc()
        log.warning("affinity store %s failed", op, exc_info=True)
