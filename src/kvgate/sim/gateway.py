"""The simulated gateway: the live router's decision flow, driven synchronously.

Per request, as ``kvgate.gateway.dataplane.router`` does it live: features -> affinity
lookup -> admission (``kvgate.core.admission``) -> ``policy.pick`` on a fresh
snapshot -> apply the decision (count it in flight, write the affinity with
compare-and-set, ``policy.on_routed``) -> the worker. When the response ends:
``policy.on_usage`` and, unless the decision wrote it, the affinity's TTL is
refreshed. Requests the policy refuses with ``capacity_full`` wait in a bounded
priority queue; each finished request wakes one waiter, which asks the policy
again. The affinity store is ``kvgate.store``'s own ``SessionTable`` (what
``MemoryStore`` wraps), read against virtual time.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass

from kvgate.core.admission import AdmissionConfig, Queue, Shed, admit, fleet_saturation, wait_order
from kvgate.core.decision import Affinity, Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import FleetSnapshot
from kvgate.core.holders import HOLDER_TTL_S, holder_writes, holders_from, lookup_keys
from kvgate.core.policy import Policy, RouteContext
from kvgate.engine import EngineRequest, FinishedRequest
from kvgate.sim.metrics import RunRecorder
from kvgate.sim.worker import SimWorker
from kvgate.store.holders import HolderTable
from kvgate.store.table import SessionTable
from kvgate.types import Seconds
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import SimRequest

Submit = Callable[[SimWorker, EngineRequest, Seconds], None]


@dataclass(slots=True)
class Flight:
    """A request the gateway placed on a worker and has not seen finish."""

    request: SimRequest
    features: RequestFeatures
    worker: SimWorker
    wrote_affinity: bool
    queued: Seconds


@dataclass(slots=True)
class _Waiter:
    request: SimRequest
    features: RequestFeatures
    affinity: Affinity | None
    since: Seconds
    deadline: Seconds


class SimGateway:
    """One gateway replica with its policy, affinity store and admission queue."""

    def __init__(
        self,
        workers: list[SimWorker],
        policy: Policy,
        codec: PromptCodec,
        recorder: RunRecorder,
        submit: Submit,
        *,
        admission: AdmissionConfig,
        affinity_ttl: Seconds,
        rng: random.Random,
        max_sessions: int = 1_000_000,
    ) -> None:
        self.workers = workers
        self._by_id = {w.id: w for w in workers}
        self.policy = policy
        self.codec = codec
        self.recorder = recorder
        self.submit = submit
        self.admission = admission
        self.ttl = affinity_ttl
        self.rng = rng
        self.table = SessionTable(max_sessions)
        self.holders = HolderTable()
        """The shared prefix state (``core.holders``), as ``MemoryStore`` keeps it live."""
        self.flights: dict[str, Flight] = {}
        self._queue: list[tuple[tuple[int, int], int, _Waiter]] = []
        self._order = 0

    @property
    def queue_depth(self) -> int:
        """Requests waiting in the admission queue."""
        return len(self._queue)

    def _context(
        self, features: RequestFeatures, affinity: Affinity | None, now: Seconds
    ) -> RouteContext:
        """The policy's context, with the store's prefix holders as the live router reads them."""
        keys = lookup_keys(features.prefix_hashes, features.checkpoints, affinity is not None)
        holders = (
            holders_from(features.checkpoints, self.holders.get_many(keys, now)) if keys else {}
        )
        return RouteContext(self.snapshot(now), affinity, self.rng, holders)

    def snapshot(self, now: Seconds) -> FleetSnapshot:
        """The fleet as routing sees it at ``now``."""
        return FleetSnapshot(now, tuple(w.state(now) for w in self.workers))

    # -- arrivals ----------------------------------------------------------------

    def arrive(self, request: SimRequest, now: Seconds) -> None:
        """A request reached the gateway: admit, route, queue or shed it."""
        self.recorder.arrived(now)
        features = self.codec.features_of(request)
        key = features.affinity_key
        affinity = self.table.get(key, now) if key is not None else None
        snap = self.snapshot(now)
        cfg = self.admission
        verdict = admit(
            cfg, request.priority, len(self._queue), fleet_saturation(snap, cfg.kv_saturated)
        )
        if isinstance(verdict, Shed):
            self.recorder.shed(verdict.reason)
            return
        if isinstance(verdict, Queue):
            self._enqueue(request, features, affinity, now, verdict.max_wait)
            return
        decision = self.policy.pick(features, self._context(features, affinity, now))
        if decision.worker is None:
            if decision.reason != "capacity_full":
                # A policy that sheds while workers have room does so for its own
                # reasons (priority, pressure): waiting would not help.
                self.recorder.shed(decision.reason)
                return
            verdict = admit(cfg, request.priority, len(self._queue), 1.0)
            if isinstance(verdict, Queue):
                self._enqueue(request, features, affinity, now, verdict.max_wait)
            elif isinstance(verdict, Shed):
                self.recorder.shed(verdict.reason)
            return
        self._apply(request, features, decision, now, queued=0.0, affinity=affinity)

    def _enqueue(
        self,
        request: SimRequest,
        features: RequestFeatures,
        affinity: Affinity | None,
        now: Seconds,
        max_wait: Seconds,
    ) -> None:
        self._order += 1
        key = wait_order(request.priority, self._order)
        heapq.heappush(
            self._queue,
            (key, self._order, _Waiter(request, features, affinity, now, now + max_wait)),
        )

    def _apply(
        self,
        request: SimRequest,
        features: RequestFeatures,
        decision: Decision,
        now: Seconds,
        queued: Seconds,
        *,
        affinity: Affinity | None = None,
    ) -> None:
        """Carry out a routing decision: count, bind, tell the policy, share holders, send."""
        worker = self._by_id[decision.worker or ""]
        if not worker.engine.fits(request.prompt_tokens, request.max_tokens):
            # The worker would answer 400 (longer than its context); nothing is placed.
            self.recorder.shed("too_long")
            return
        worker.in_flight += 1
        worker.changed()
        wrote = False
        migrated = False
        write = decision.affinity
        if write is not None:
            wanted = Affinity(write.session_key, write.worker, write.version, now)
            self.table.compare_and_set(
                write.session_key, write.expected, wanted, now + self.ttl, now
            )
            wrote = True
            migrated = write.expected is not None and write.expected != write.worker
        self.policy.on_routed(features, worker.id, now)
        keys = lookup_keys(features.prefix_hashes, features.checkpoints, affinity is not None)
        if keys:
            # As the live router does: other replicas learn where the checkpoints went.
            seen = self.holders.get_many(keys, now)
            writes = holder_writes(keys, seen, worker.id)
            self.holders.set_many(writes, now, min(self.ttl, HOLDER_TTL_S))
        self.recorder.routed(decision.reason, migrated)
        self.flights[request.request_id] = Flight(request, features, worker, wrote, queued)
        blocks, output_blocks = self.codec.engine_blocks_with_reply(request.segments, request.reply)
        engine_request = EngineRequest(
            request_id=request.request_id,
            block_hashes=blocks,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.max_tokens,
            session_id=request.session_id,
            output_block_hashes=output_blocks,
        )
        self.submit(worker, engine_request, now)

    # -- completions -------------------------------------------------------------

    def finished(self, done: FinishedRequest, now: Seconds) -> None:
        """A response ended: usage to the policy, refresh the affinity, free the slot."""
        flight = self.flights.pop(done.request_id)
        worker = flight.worker
        worker.in_flight -= 1
        worker.changed()
        features = flight.features
        self.policy.on_usage(features, worker.id, done.prompt_tokens, done.cached_tokens, now)
        key = features.affinity_key
        if key is not None and not flight.wrote_affinity:
            self.table.touch(key, now, now + self.ttl, now)
        arrival = flight.request.arrival
        self.recorder.finish(
            worker.index,
            ttft=done.first_token_time - arrival,
            e2e=done.finish_time - arrival,
            queued=flight.queued,
            prompt_tokens=done.prompt_tokens,
            cached_tokens=done.cached_tokens,
            output_tokens=done.output_tokens,
            now=now,
        )
        self._wake_one(now)

    def _wake_one(self, now: Seconds) -> None:
        """A slot freed: the most important, oldest live waiter asks the policy again."""
        queue = self._queue
        while queue:
            _, _, waiter = queue[0]
            if waiter.deadline < now:
                heapq.heappop(queue)
                self.recorder.shed("queue_timeout")
                continue
            ctx = self._context(waiter.features, waiter.affinity, now)
            decision = self.policy.pick(waiter.features, ctx)
            if decision.worker is None and decision.reason == "capacity_full":
                return  # still no room: it keeps its place and its deadline
            heapq.heappop(queue)
            if decision.worker is None:
                self.recorder.shed(decision.reason)
                continue
            self._apply(
                waiter.request,
                waiter.features,
                decision,
                now,
                now - waiter.since,
                affinity=waiter.affinity,
            )
            return

    def expire_waiters(self) -> None:
        """At the end of a run: whoever still waits is refused (their wait ran out)."""
        while self._queue:
            heapq.heappop(self._queue)
            self.recorder.shed("queue_timeout")
