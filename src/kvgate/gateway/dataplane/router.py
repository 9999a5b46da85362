"""The live driver of the routing pipeline: store lookup, ``core.route``, lease, affinity write.

Per request: features -> (if it has an affinity key) ``store.get`` -> the
version (``VersionRegistry.assign``) -> ``core.route.route`` on a fresh
snapshot, carried out: ``Place`` takes a lease on the worker (its in-flight
slot and KV estimate) and writes the affinity with compare-and-set (if another
replica won, ``follows_binding`` says whether to follow it), ``Hold`` and
``Queue`` wait in the admission queue and ask again, ``Shed`` is a 429 and
``Unavailable`` a 503. The router decides nothing itself. What the request adds to
the shared prefix state rides on the placement (``Attempt.shares``) and is
written by ``share`` once the request is written to its worker: only later
requests read it, so it is off the path to the worker (and with Redis, one round
trip off the request).

A policy that never reads bindings nor the shared prefix state
(``Policy.reads_affinity``), on a model whose versions are not split, gets no
store lookup, no prefix-state read and no touch: ``lookup`` answers ``UNREAD``,
and ``place`` reads both only if the snapshot shows a worker under pressure or
full (``core.route.needs_affinity``), where they change the verdict. The prefix
state the request adds is still written, so pressure later finds it.

``place`` returns an ``Attempt`` (``dataplane.attempt``), which took the worker's
lease and told the policy; the data plane reports the attempt's events to it and
it ends once (lease, policy, passive health, outcome). Until ``place`` returns,
``place`` owns it, so a request cancelled while it awaits the store ends the
attempt it made (its slot given back). The router implements the attempt's
``Bindings`` (the store writes it makes): ``share``, ``touch``, ``remember``.

The store is advisory: its errors are counted and logged, never fail a request.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence

from kvgate.core.admission import Shed
from kvgate.core.decision import Affinity
from kvgate.core.features import RequestFeatures
from kvgate.core.holders import (
    HOLDER_TTL_S,
    holder_writes,
    holders_from,
    lookup_keys,
)
from kvgate.core.policy import Policy, RouteContext
from kvgate.core.route import (
    Hold,
    Place,
    Queue,
    RouteConfig,
    Unavailable,
    follows_binding,
    needs_affinity,
    queue_displaced,
    queue_timeout,
    route,
    under_parent,
)
from kvgate.core.warmup import WarmUp
from kvgate.gateway.control.outcomes import OutcomeRecorder
from kvgate.gateway.control.versions import VersionRegistry
from kvgate.gateway.dataplane.attempt import (
    UNREAD,
    Attempt,
    AttemptParts,
    EndListener,
    Looked,
    PassiveHealth,
    Unread,
    UsageListener,
)
from kvgate.gateway.dataplane.errors import NoHealthyWorkerError, OverloadedError
from kvgate.gateway.dataplane.queue import DisplacedError
from kvgate.gateway.observe.kvcache import EngineCaches
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.routing import Routing, RoutingState
from kvgate.store.base import AffinityStore
from kvgate.types import BlockHash, Priority, Seconds, SessionKey, SessionSource, WorkerId

log = logging.getLogger("kvgate.gateway.dataplane.router")

_CONTINUES = SessionSource.CONTINUATION
"""A module constant: on 3.11 ``Enum.MEMBER`` costs a slow ``EnumType`` lookup a request."""


__all__ = ["UNREAD", "Looked", "Router", "Unread"]


class _NoHealth:
    """Passive health for a router made without one (tests): judgements go nowhere."""

    def success(self, worker: Worker) -> None:
        return None

    def failure(self, worker: Worker) -> None:
        return None


class Router:
    """Turns request features into a placed attempt holding a lease on one worker."""

    def stable_version(self, model: str) -> str | None:
        """The stable version of ``model`` (None without a version registry or entry)."""
        found = self.versions.get(model) if self.versions is not None else None
        return found.stable if found is not None else None

    def __init__(
        self,
        pool: WorkerPool,
        routing: Routing,
        store: AffinityStore,
        metrics: GatewayMetrics,
        config: RouteConfig,
        *,
        affinity_ttl: Seconds,
        rng: random.Random,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        versions: VersionRegistry | None = None,
        usage_listeners: Sequence[UsageListener] = (),
        passive: PassiveHealth | None = None,
        outcomes: OutcomeRecorder | None = None,
        end_listeners: Sequence[EndListener] = (),
        caches: EngineCaches | None = None,
    ) -> None:
        self.pool = pool
        self.caches = caches
        """What publishing workers' engines hold (their KV events; ``None``: none publish)."""
        self.versions = versions
        """Model versions: a split model's request sees only its assigned version's workers."""
        self.passive: PassiveHealth = passive or _NoHealth()
        self.outcomes = outcomes
        self.end_listeners = tuple(end_listeners)
        self.usage_listeners = tuple(usage_listeners)
        self.wall = wall
        self.mono = mono
        self.routing = routing
        """The routing state in force (policy, aliases): read once per placement."""
        self._parts: tuple[RoutingState, AttemptParts] | None = None
        self.store = store
        self.metrics = metrics
        self.config = config
        self.ttl = affinity_ttl
        self._holder_ttl = min(affinity_ttl, HOLDER_TTL_S)
        self.rng = rng
        self.kv_holds = 0
        """Requests held at least once for KV headroom (for benchmarks and tests)."""

    @property
    def policy(self) -> Policy:
        """The routing policy in force."""
        return self.routing.state.policy

    def add_end_listener(self, listener: EndListener) -> None:
        """Tell ``listener`` every attempt's end from the next placement on."""
        self.end_listeners = (*self.end_listeners, listener)
        self._parts = None

    def parts(self, state: RoutingState) -> AttemptParts:
        """What the attempts placed under ``state`` report to (made once per state)."""
        made = self._parts
        if made is not None and made[0] is state:
            return made[1]
        parts = AttemptParts(
            state.policy,
            self.passive,
            self,
            self.outcomes,
            self.usage_listeners,
            self.end_listeners,
            self.mono,
            self.wall,
        )
        self._parts = (state, parts)
        return parts

    def _split(self, model: str) -> bool:
        """True when the model's versions are split (a binding holds its version)."""
        return self.versions is not None and self.versions.get(model) is not None

    async def lookup(self, features: RequestFeatures) -> Looked:
        """The store's binding for the request's affinity key (``None`` on miss or error);
        ``UNREAD`` when neither the policy nor a version split reads it."""
        key = features.affinity_key
        if key is None:
            return None
        if not self.policy.reads_affinity and not self._split(features.model):
            return UNREAD
        return await self._read(key)

    async def read(self, key: SessionKey) -> Affinity | None:
        """The store's binding for ``key`` (``None`` on miss or error, which is counted)."""
        return await self._read(key)

    async def _read(self, key: SessionKey) -> Affinity | None:
        """The store's binding for ``key`` (``None`` on miss or error, which is counted)."""
        try:
            found = await self.store.get(key)
        except Exception:
            self._store_failed("get")
            self.metrics.affinity.labels("error").inc()
            return None
        m = self.metrics
        m.cells.counter(m.affinity, "hit" if found is not None else "miss").inc()
        return found

    async def place(
        self,
        features: RequestFeatures,
        looked: Looked,
        excluded: frozenset[WorkerId] = frozenset(),
        version: str | None = None,
        *,
        started: float | None = None,
    ) -> Attempt:
        """Carry out ``core.route`` until it places the request; the caller owns the attempt.

        ``version`` overrides the version the registry would assign (a retry falling
        back to the stable version); ``started`` is when the request arrived (monotonic).
        Raises ``NoHealthyWorkerError`` (503) or ``OverloadedError`` (429).
        """
        state = self.routing.state  # one policy for the whole placement, and its attempt
        policy = state.policy
        queue = self.pool.queue
        priority = features.priority
        queued_at: float | None = None
        deadline = 0.0
        held_at: float | None = None
        held_for = 0.0  # how long the holds whose waits ran out lasted, at least
        split = self._split(features.model)
        key = features.affinity_key
        # Until a snapshot says otherwise, nothing may read the binding or the shared
        # prefix state (``core.route.needs_affinity``): neither is looked up.
        lazy = not policy.reads_affinity and not split and features.session_source is not _CONTINUES
        if isinstance(looked, Unread) and not lazy and key is not None:
            looked = await self._read(key)  # a split appeared since ``lookup``
        affinity = None if isinstance(looked, Unread) else looked
        # A subagent without a binding of its own routes under its parent's
        # (``core.route.under_parent``), on its version where versions are split.
        parent = None if lazy else await self._parent(features, affinity)
        if version is None and self.versions is not None:
            version = self.versions.assign(features, under_parent(features, affinity, parent))
        if lazy:
            # What this request adds to the shared prefix state is still written.
            keys = lookup_keys(features.prefix_hashes, features.checkpoints, affinity is not None)
            seen: list[WorkerId | None] = [None] * len(keys)
            holders: Mapping[WorkerId, int] = {}
        else:
            keys, seen, holders = await self._holders(features, affinity)
        resident = self.caches.resident(features) if self.caches is not None else None
        while True:
            snap = self.pool.snapshot(features.model, self.wall(), self.mono(), version)
            snap = snap.without(excluded)
            if lazy and needs_affinity(policy, snap, split):
                # Pressure or a full worker: the binding and the prefix state now change
                # the verdict (pressure spares known sessions and continued chains).
                lazy = False
                if isinstance(looked, Unread) and key is not None:
                    looked = affinity = await self._read(key)
                keys, seen, holders = await self._holders(features, affinity)
                parent = await self._parent(features, affinity)
                continue  # the snapshot is stale after the awaits
            held_s = None if held_at is None else max(self.mono() - held_at, held_for)
            verdict = route(
                features,
                affinity,
                snap,
                policy,
                self.rng,
                queue_depth=len(queue),
                held_s=held_s,
                config=self.config,
                holders=holders,
                resident=resident,
                parent=parent,
                waiting=queue.waiting,
            )
            if isinstance(verdict, Place):
                break
            if isinstance(verdict, Hold):
                # Sending now would make the worker's running requests outgrow its KV
                # cache and be preempted; a release (or a scrape) wakes every waiter.
                if held_at is None:
                    held_at = self.mono()
                    self.kv_holds += 1
                # Woken by a release, or its wait ran out: ask again either way (past
                # the gate's longest wait ``route`` places it; before, it may move it).
                # A wait that ran out lasted its whole ``max_wait`` whatever the clock says.
                if not await queue.wait(priority, verdict.max_wait, features.tenant, hold=True):
                    held_for = (held_s or 0.0) + verdict.max_wait
                continue
            if isinstance(verdict, Queue):
                # Every routable worker is at its in-flight limit: wait for a slot.
                now = self.mono()
                if queued_at is None:
                    queued_at = now
                    deadline = now + verdict.max_wait
                try:
                    woken = await queue.wait(
                        priority, deadline - now, features.tenant, displaces=verdict.displaces
                    )
                except DisplacedError:
                    # Its tenant held the most of the full queue; another's took its place.
                    self._observe_wait(priority, self.mono() - queued_at)
                    raise self._shed(features, queue_displaced(self.config, len(queue))) from None
                if woken:
                    continue
                self._observe_wait(priority, self.mono() - queued_at)
                verdict = queue_timeout(self.config, len(queue))
            if isinstance(verdict, Unavailable):
                raise NoHealthyWorkerError(f"no healthy worker serves model {features.model!r}")
            raise self._shed(features, verdict)
        attempt = await self._apply(
            features,
            verdict,
            excluded,
            queued_at,
            held_at,
            parts=self.parts(state),
            started=started,
            looked_up=(keys, seen),
        )
        attempt.affinity = looked
        return attempt

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

    async def _parent(
        self, features: RequestFeatures, affinity: Affinity | None
    ) -> Affinity | None:
        """The store's binding of the parent a subagent's request names, while the subagent
        has none of its own: it routes under it (``core.route.under_parent``), its parent's
        worker holding its shared prefix.
        ``None``: not a subagent's, bound already, no parent binding, or a store error."""
        parent = features.parent_key
        if parent is None or affinity is not None:
            return None
        try:
            return await self.store.get(parent)
        except Exception:
            self._store_failed("get")
            return None

    def share(self, writes: Sequence[tuple[BlockHash, WorkerId]], tenant: str = "") -> None:
        """Tell other replicas where an attempt's checkpoint blocks went (``Attempt.sent``),
        counted against the request's ``tenant``.

        Called once the request is written to the worker: with the memory store the
        state is readable when this returns; a remote store writes in the background.
        """
        self.store.set_holders_soon(writes, self._holder_ttl, self._holders_failed, tenant)

    def warm_up(self, features: RequestFeatures, worker: Worker) -> WarmUp | None:
        """The policy's warm-up after ``features`` was placed on ``worker`` (``core.warmup``),
        judged on a fresh snapshot of the workers of ``worker``'s version."""
        version = worker.version if self._split(features.model) else None
        snap = self.pool.snapshot(features.model, self.wall(), self.mono(), version)
        return self.policy.warm_up(worker.id, RouteContext(snap, None, self.rng))

    def _holders_failed(self) -> None:
        self._store_failed("set_holders")

    async def _apply(
        self,
        features: RequestFeatures,
        verdict: Place,
        excluded: frozenset[WorkerId],
        queued_at: float | None,
        held_at: float | None,
        *,
        parts: AttemptParts,
        started: float | None,
        looked_up: tuple[list[BlockHash], list[WorkerId | None]] = ([], []),
    ) -> Attempt:
        """Make the attempt (it takes the lease), write the affinity, tell the policy;
        note the prefix-state writes for ``Attempt.sent``.

        The attempt is cancelled (its lease given back) on any error or cancellation
        before it is returned.
        """
        worker = self.pool.get(verdict.worker)
        assert worker is not None  # the snapshot was taken from the pool without an await
        now = self.mono()
        queued_s = 0.0
        if queued_at is not None:
            queued_s = now - queued_at
            self._observe_wait(features.priority, queued_s)
        if held_at is not None:
            queued_s += now - held_at
        attempt = Attempt(
            parts,
            features,
            self.pool,
            worker,
            verdict.kv_tokens,
            reason=verdict.reason,
            version=verdict.version or worker.version,
            queued_s=queued_s,
            started=started,
        )
        try:
            if verdict.affinity is not None:
                await self._bind(features, verdict, attempt, excluded)
            m = self.metrics
            m.cells.counter(
                m.decisions,
                features.model,
                attempt.version,
                attempt.worker.id,
                attempt.reason,
            ).inc()
            attempt.routed()
            if looked_up[0]:
                attempt.shares = holder_writes(*looked_up, attempt.worker.id)
        except BaseException:
            attempt.cancelled()
            raise
        return attempt

    async def _bind(
        self,
        features: RequestFeatures,
        verdict: Place,
        place: Attempt,
        excluded: frozenset[WorkerId],
    ) -> None:
        """Write the verdict's affinity; follow another replica's binding if it won."""
        write = verdict.affinity
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
        if bound.worker == place.worker.id:
            return  # this replica's write won (the usual case)
        other = self.pool.get(bound.worker)
        state = other.state(self.mono(), self.pool.stale_after) if other is not None else None
        if other is not None and follows_binding(features, place.worker.id, bound, state, excluded):
            place.move(other, bound.version or other.version)
            place.reason = "affinity_race"

    def _observe_wait(self, priority: Priority, seconds: float) -> None:
        self.metrics.queue_wait.labels(priority.name.lower()).observe(seconds)

    def _shed(self, features: RequestFeatures, verdict: Shed) -> OverloadedError:
        reason = verdict.reason
        self.metrics.sheds.labels(reason, features.priority.name.lower()).inc()
        return OverloadedError(
            f"the fleet serving {features.model!r} is overloaded ({reason}); retry later",
            retry_after=verdict.retry_after or 1.0,
            reason=reason,
        )

    async def touch(self, key: SessionKey) -> None:
        """Renew ``key``'s binding after a completed attempt (an error is counted)."""
        try:
            await self.store.touch(key, self.wall(), self.ttl)
        except Exception:
            self._store_failed("touch")

    async def remember(self, key: SessionKey, worker: WorkerId, version: str) -> None:
        """Bind a key the worker's answer named (a response id) to the worker that made it.

        A later request naming that key (``previous_response_id``) then goes back to
        the one worker holding the state it continues.
        """
        bound = Affinity(key, worker, version, self.wall())
        try:
            await self.store.compare_and_set(key, None, bound, self.ttl)
        except Exception:
            self._store_failed("compare_and_set")

    async def follow(
        self, key: SessionKey, expected: WorkerId, worker: WorkerId, version: str
    ) -> None:
        """Move ``key``'s binding from ``expected`` to ``worker`` (a native proxy's
        fallback served the request there); a binding moved meanwhile stays."""
        bound = Affinity(key, worker, version, self.wall())
        try:
            await self.store.compare_and_set(key, expected, bound, self.ttl)
        except Exception:
            self._store_failed("compare_and_set")

    async def forget(self, key: SessionKey) -> None:
        """Drop ``key``'s binding (a stored response its worker deleted): a request naming
        it is then the gateway's 404, as it is the worker's, instead of reaching it."""
        try:
            await self.store.delete(key)
        except Exception:
            self._store_failed("delete")

    def _store_failed(self, op: str) -> None:
        self.metrics.store_errors.labels(op).inc()
        log.warning("affinity store %s failed", op, exc_info=True)
