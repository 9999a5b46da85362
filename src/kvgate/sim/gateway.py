"""The simulated gateway: the live router's pipeline (``core.route``), driven synchronously.

Per request, as ``kvgate.gateway.dataplane.router`` does it live: features ->
affinity lookup -> version (``core.versions.assign_version``, when the model is
split) -> ``core.route.route`` on a fresh snapshot of that version's workers,
and its verdict carried out:

- ``Place``: count it in flight (with its KV demand), write the affinity with
  compare-and-set (following the binding in force when it lost, as
  ``follows_binding`` says), ``policy.on_routed``, submit to the engine.
- ``Queue`` / ``Hold``: wait in one priority-ordered queue; a finished request
  wakes one waiter (every waiter when it held KV, or when a scrape changed a
  worker's pressure), which asks ``route`` again. A queued request past its
  wait is refused (``queue_timeout``); a held one past its hold is placed.
- ``Shed`` / ``Unavailable``: refused, counted by reason.

Each placement is an attempt (``core.attempt.AttemptState``), stepped as the live
``Attempt`` is, in virtual time: routed and sent at placement, its first token and
usage when the engine finishes it, completed then; its one end frees the slot,
tells the policy (``core.attempt.tell_policy``: ``on_usage``) and goes to
``attempt_ended`` (a speed estimator learns from it), and, unless the decision
wrote it, the affinity's TTL is refreshed. After each scrape, pressure levels follow the
workers' KV and GPU readings (``core.pressure.PressureTracker``), as the live
pressure driver sets them; migration of sessions off ``HARD`` workers is not
simulated. The affinity store is ``kvgate.store``'s own ``SessionTable`` (what
``MemoryStore`` wraps), read against virtual time.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvgate.core.admission import Queue, wait_order
from kvgate.core.attempt import AttemptEnd, AttemptState, tell_policy
from kvgate.core.decision import Affinity
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import FleetSnapshot
from kvgate.core.holders import (
    HOLDER_TTL_S,
    holder_writes,
    holders_from,
    lookup_keys,
)
from kvgate.core.policy import Policy, Resident, RouteContext
from kvgate.core.pressure import PressureTracker
from kvgate.core.route import (
    Hold,
    Place,
    RouteConfig,
    Verdict,
    follows_binding,
    queue_timeout,
    route,
    under_parent,
)
from kvgate.core.toolcalls import OFFLOAD_AT, leaves_away
from kvgate.core.versions import ModelVersions, assign_version
from kvgate.engine import EngineRequest, FinishedRequest
from kvgate.sim.kvfeed import KVFeed
from kvgate.sim.toolcalls import SimToolCalls
from kvgate.sim.worker import SimWorker
from kvgate.store.holders import HolderTable
from kvgate.store.table import SessionTable
from kvgate.types import BlockHash, Seconds, WorkerId
from kvgate.workload.misses import Misses
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.recorder import RunRecorder
from kvgate.workload.request import SimRequest

Submit = Callable[[SimWorker, EngineRequest, Seconds], None]
Ended = Callable[[str, Seconds], None]
"""``ended(request_id, now)``: a request was answered or refused at ``now``."""
Timer = Callable[[Seconds], None]
"""``timer(at)``: call ``SimGateway.timer_fired`` at ``at``."""
AttemptEnded = Callable[[RequestFeatures, AttemptEnd], None]
"""Told every attempt's end, as the live gateway's end listeners are."""


@dataclass(slots=True)
class Flight:
    """A request the gateway placed on a worker and has not seen finish."""

    request: SimRequest
    features: RequestFeatures
    worker: SimWorker
    wrote_affinity: bool
    queued: Seconds
    attempt: AttemptState
    kv_tokens: int = 0


@dataclass(slots=True)
class _Waiter:
    request: SimRequest
    features: RequestFeatures
    affinity: Affinity | None
    version: str | None
    since: Seconds
    deadline: Seconds | None = None
    """When its queue wait runs out (it is refused then); set when it first queues."""
    held_since: Seconds | None = None
    """When it was first held for KV headroom (``None``: never)."""
    wake_at: Seconds | None = None
    """When its hold's ``max_wait`` runs out, as last asked of the driver's timer."""
    blocks: list[BlockHash] | None = None
    """Its prompt's engine blocks, once looked up in the exact index."""


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
        config: RouteConfig,
        affinity_ttl: Seconds,
        rng: random.Random,
        versions: ModelVersions | None = None,
        pressure: PressureTracker | None = None,
        max_sessions: int = 1_000_000,
        misses: Misses | None = None,
        ended: Ended | None = None,
        timer: Timer | None = None,
        feed: KVFeed | None = None,
        attempt_ended: AttemptEnded | None = None,
    ) -> None:
        self.workers = workers
        self._by_id = {w.id: w for w in workers}
        self.policy = policy
        self.codec = codec
        self.recorder = recorder
        self.submit = submit
        self.config = config
        self.ttl = affinity_ttl
        self.rng = rng
        self.versions = versions
        """The model's versions and weights (``None``: not split, any worker serves it)."""
        self.pressure = pressure
        """Levels from each scrape's readings (``None``: pressure handling off)."""
        self.table = SessionTable(max_sessions)
        self.holders = HolderTable()
        """The shared prefix state (``core.holders``), as ``MemoryStore`` keeps it live."""
        self.misses = misses
        """Where the run's cache misses went (``workload.misses``; ``None``: not followed)."""
        self.ended = ended
        """Told of every request's end, answered or refused (the clients' next turns)."""
        self.timer = timer
        """Asked to call ``timer_fired`` at a time: when a hold's ``max_wait`` runs out
        (``None``: a hold is asked again only when a release or a scrape wakes it)."""
        self.feed = feed
        """The engines' KV events and the exact index (``None``: the policy infers caches)."""
        self.attempt_ended = attempt_ended
        """Told every attempt's end (``None``: nobody)."""
        self.flights: dict[str, Flight] = {}
        self.warm_flights: dict[str, tuple[RequestFeatures, SimWorker]] = {}
        """Warm-ups sent and not finished (``core.warmup``), by their request ids."""
        self.warm_ups = 0
        self.warm_up_tokens = 0
        """Prompt tokens the warm-ups sent: prefill no client asked for."""
        self.warm_up_cached = 0
        self._opener_blocks: dict[str, list[BlockHash]] = {}
        """Engine blocks of the requests ``policy.openers`` names (a warm-up is cut from one)."""
        self.kv_holds = 0
        """Requests held at least once for KV headroom."""
        self.tool_calls = SimToolCalls(workers, OFFLOAD_AT) if pressure is not None else None
        """Sessions away on a tool call (``sim.toolcalls``; ``None``: pressure handling off)."""
        self._queue: list[tuple[tuple[int, int], int, _Waiter]] = []
        self._order = 0

    @property
    def queue_depth(self) -> int:
        """Requests waiting in the admission queue (for a slot or for KV headroom)."""
        return len(self._queue)

    def snapshot(self, now: Seconds, version: str | None = None) -> FleetSnapshot:
        """The fleet as routing sees it at ``now``; with ``version``, only its workers."""
        states = tuple(
            w.state(now) for w in self.workers if version is None or w.version == version
        )
        return FleetSnapshot(now, states)

    # -- arrivals ----------------------------------------------------------------

    def arrive(self, request: SimRequest, now: Seconds) -> None:
        """A request reached the gateway: route it and carry out the verdict."""
        self.recorder.arrived(now)
        features = self.codec.features_of(request)
        key = features.affinity_key
        if self.tool_calls is not None:
            self.tool_calls.returned(key, now)
        affinity = self.table.get(key, now) if key is not None else None
        version = None
        if self.versions is not None:
            under = under_parent(features, affinity, self._parent(features, affinity, now))
            bound = under.version if under is not None else None
            version, _ = assign_version(
                self.versions, key, features.request_id, pinned=None, bound=bound
            )
        waiter = _Waiter(request, features, affinity, version, now)
        verdict = self._route(waiter, now, len(self._queue))
        if isinstance(verdict, Queue | Hold):
            self._enqueue(waiter, verdict, now)
        else:
            self._carry_out(waiter, verdict, now)

    def _holder_keys(self, waiter: _Waiter) -> list[int]:
        features = waiter.features
        return lookup_keys(
            features.prefix_hashes, features.checkpoints, waiter.affinity is not None
        )

    def _route(self, waiter: _Waiter, now: Seconds, queue_depth: int) -> Verdict:
        held_s = None if waiter.held_since is None else now - waiter.held_since
        keys = self._holder_keys(waiter)
        # The store's prefix holders, as the live router reads them before routing.
        seen = self.holders.get_many(keys, now) if keys else []
        holders: Mapping[WorkerId, int] = (
            holders_from(waiter.features.checkpoints, seen) if keys else {}
        )
        parent = self._parent(waiter.features, waiter.affinity, now)
        return route(
            waiter.features,
            waiter.affinity,
            self.snapshot(now, waiter.version),
            self.policy,
            self.rng,
            queue_depth=queue_depth,
            held_s=held_s,
            config=self.config,
            holders=holders,
            resident=self._resident(waiter, now),
            parent=parent,
        )

    def _parent(
        self, features: RequestFeatures, affinity: Affinity | None, now: Seconds
    ) -> Affinity | None:
        """A subagent's parent's binding while it has none of its own (the live router's)."""
        parent = features.parent_key
        if parent is None or affinity is not None:
            return None
        return self.table.get(parent, now)

    def _resident(self, waiter: _Waiter, now: Seconds) -> Resident | None:
        """What the engines hold of the request's prompt, by their KV events."""
        feed = self.feed
        if feed is None:
            return None
        feed.pump(now)  # idle probes
        if waiter.blocks is None:
            waiter.blocks = self.codec.engine_blocks(waiter.request.segments)
        size = self.codec.block_size
        groups = [(depth * size, ws) for depth, ws in feed.index.match_groups(waiter.blocks)]
        prompt = waiter.request.prompt_tokens
        exact = frozenset(feed.index.workers())
        return Resident.of_tokens(groups, prompt, waiter.features.prompt_chars, exact)

    def _enqueue(self, waiter: _Waiter, verdict: Queue | Hold, now: Seconds) -> None:
        self._note_wait(waiter, verdict, now)
        self._order += 1
        key = wait_order(waiter.request.priority, self._order)
        heapq.heappush(self._queue, (key, self._order, waiter))

    def _note_wait(self, waiter: _Waiter, verdict: Queue | Hold, now: Seconds) -> None:
        if isinstance(verdict, Hold):
            if waiter.held_since is None:
                waiter.held_since = now
                self.kv_holds += 1
            # As the live router: when the hold's wait runs out, it asks again.
            wake = now + verdict.max_wait
            pending = waiter.wake_at
            later = pending is None or pending <= now or wake < pending
            if self.timer is not None and wake > now and later:
                waiter.wake_at = wake
                self.timer(wake)
        elif waiter.deadline is None:
            waiter.deadline = now + verdict.max_wait  # fixed when it first queues

    def _carry_out(self, waiter: _Waiter, verdict: Verdict, now: Seconds) -> None:
        """A verdict other than a wait: place the request or refuse it."""
        if isinstance(verdict, Hold):
            verdict = verdict.place
        if isinstance(verdict, Place):
            self._apply(waiter, verdict, now)
        else:
            self._refuse(waiter.request, verdict.reason, now)

    def _apply(self, waiter: _Waiter, verdict: Place, now: Seconds) -> None:
        """Carry out a placement: count, bind, tell the policy, send."""
        request, features = waiter.request, waiter.features
        worker = self._by_id[verdict.worker]
        if not worker.engine.fits(request.prompt_tokens, request.max_tokens):
            # The worker would answer 400 (longer than its context); nothing is placed.
            # Where no worker could run it the request is the workload's fault, not the
            # router's: it is not held against the router (``RunRecorder.unanswered``).
            servable = any(w.engine.fits(request.prompt_tokens, request.max_tokens)
                           for w in self.workers)  # fmt: skip
            self._refuse(request, "too_long", now, servable=servable)
            return
        reason = verdict.reason
        wrote = False
        migrated = False
        write = verdict.affinity
        if write is not None:
            wanted = Affinity(write.session_key, write.worker, write.version, now)
            bound = self.table.compare_and_set(
                write.session_key, write.expected, wanted, now + self.ttl, now
            )
            wrote = True
            migrated = write.expected is not None and write.expected != write.worker
            other = self._by_id.get(bound.worker) if bound.worker != worker.id else None
            if other is not None and follows_binding(features, worker.id, bound, other.state(now)):
                worker, reason, migrated = other, "affinity_race", False
        attempt = AttemptState(
            worker.id,
            worker.version,
            now,
            ahead_requests=worker.routed.in_flight,
            ahead_kv_tokens=worker.routed.kv_in_flight_tokens,
        )
        worker.load(1, verdict.kv_tokens)
        self.policy.on_routed(features, worker.id, now)
        attempt.routed(now)
        keys = self._holder_keys(waiter)
        if keys:
            # As the live router does: other replicas learn where the checkpoints went.
            seen = self.holders.get_many(keys, now)
            writes = holder_writes(keys, seen, worker.id)
            self.holders.set_many(writes, now, min(self.ttl, HOLDER_TTL_S))
        self.recorder.routed(reason, migrated)
        queued = now - waiter.since
        self.flights[request.request_id] = Flight(
            request, features, worker, wrote, queued, attempt, verdict.kv_tokens
        )
        blocks, reply_blocks, output_blocks = self.codec.engine_blocks_with_output(
            request.segments, request.reply, request.max_tokens
        )
        if self.feed is not None:
            self.feed.note_placement(worker.id, blocks)
        if self.misses is not None:
            self.misses.placed(
                request.request_id,
                worker.id,
                request.prompt_tokens,
                blocks,
                reply_blocks,
                conversation=request.conversation,
                held=lambda wid: self._held(wid, blocks, request.prompt_tokens),
            )
        engine_request = EngineRequest(
            request_id=request.request_id,
            block_hashes=blocks,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.max_tokens,
            session_id=request.session_id,
            output_block_hashes=output_blocks,
        )
        self.submit(worker, engine_request, now)
        routed = worker.routed  # as the live attempt sees its worker when it sends
        signals = routed.signals
        waiting = signals.waiting if signals is not None else None
        attempt.sent(
            now, routed.in_flight - 1, routed.kv_in_flight_tokens - verdict.kv_tokens, waiting
        )
        self._warm_up(request.request_id, blocks, worker, waiter.version, now)

    def _warm_up(
        self,
        request_id: str,
        blocks: list[BlockHash],
        worker: SimWorker,
        version: str | None,
        now: Seconds,
    ) -> None:
        """After a placement on ``worker``: send the warm-up the policy asks for, if any
        (``core.warmup``), as the live gateway's ``WarmUps`` does."""
        policy = self.policy
        openers = policy.openers()
        if not openers:
            return
        kept = self._opener_blocks
        if request_id in openers:
            kept[request_id] = blocks
        for gone in [rid for rid in kept if rid not in openers]:
            del kept[gone]
        warm = policy.warm_up(worker.id, RouteContext(self.snapshot(now, version), None, self.rng))
        if warm is None or warm.opener not in kept:
            return
        target = self._by_id[warm.worker]
        tokens = min(
            warm.features.prompt_chars // self.codec.chars_per_token,
            len(kept[warm.opener]) * self.codec.block_size,
        )
        engine_request = EngineRequest(
            request_id=warm.features.request_id,
            block_hashes=kept[warm.opener][: tokens // self.codec.block_size],
            prompt_tokens=tokens,
            max_tokens=1,
        )
        target.load(1, 0)
        policy.on_warm(warm.features, target.id, now)
        self.warm_flights[warm.features.request_id] = (warm.features, target)
        self.warm_ups += 1
        self.warm_up_tokens += tokens
        self.submit(target, engine_request, now)

    def _held(self, worker: str, blocks: Sequence[BlockHash], prompt_tokens: int) -> int:
        """Tokens of a prompt ``worker``'s engine holds in its cache now (0: no such worker)."""
        found = self._by_id.get(worker)
        return found.engine.cached_prefix_tokens(blocks, prompt_tokens) if found else 0

    # -- completions and scrapes -------------------------------------------------

    def first_token(self, request_id: str, now: Seconds) -> None:
        """A request's first token came at ``now`` (the live relay sees its first chunk)."""
        flight = self.flights.get(request_id)
        if flight is not None:
            self.policy.on_first_token(flight.features, flight.worker.id, now)

    def finished(self, done: FinishedRequest, now: Seconds) -> None:
        """A response ended: usage to the policy, refresh the affinity, free the slot."""
        warm = self.warm_flights.pop(done.request_id, None)
        if warm is not None:  # a warm-up: no client waits for it
            features, worker = warm
            worker.load(-1, 0)
            self.warm_up_cached += done.cached_tokens
            self.policy.on_warm_done(
                features, worker.id, done.prompt_tokens, done.cached_tokens, now
            )
            self._wake(now, everyone=False)  # its slot is free
            return
        flight = self.flights.pop(done.request_id)
        worker = flight.worker
        attempt = flight.attempt
        attempt.token(done.first_token_time)
        if done.finish_time > done.first_token_time:
            attempt.token(done.finish_time)
        attempt.usage(done.prompt_tokens, done.cached_tokens, done.output_tokens)
        if flight.request.tool_call:
            attempt.tool_call(now)  # the turn ended calling its tool
        end = attempt.completed(now)
        assert end is not None  # a flight ends once: it left ``flights`` above
        worker.load(-1, -flight.kv_tokens)
        features = flight.features
        tell_policy(self.policy, features, end, now)
        if self.attempt_ended is not None:
            self.attempt_ended(features, end)
        if self.misses is not None:
            self.misses.finished(done.request_id, done.cached_tokens)
        key = features.affinity_key
        if key is not None and not flight.wrote_affinity:
            self.table.touch(key, now, now + self.ttl, now)
        if key is not None and self.tool_calls is not None:
            kv = leaves_away(end)  # as the live gateway books it, from the attempt's end
            if kv is not None:
                self.tool_calls.left(key, worker, kv, now)
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
            ttft_floor=worker.engine.alone_ttft(done.prompt_tokens, done.cached_tokens),
            returning=flight.request.returning,
        )
        # As the live pool: a release that held KV may let any held waiter fit.
        self._wake(now, everyone=flight.kv_tokens > 0)
        if self.ended is not None:
            self.ended(done.request_id, now)

    def _refuse(
        self, request: SimRequest, reason: str, now: Seconds, *, servable: bool = True
    ) -> None:
        """The request is refused at ``now`` (counted by ``reason``); it has ended.
        ``servable``: some worker could have run it (then it counts as unanswered)."""
        self.recorder.shed(reason)
        if servable:
            self.recorder.unanswered_request(request.prompt_tokens, returning=request.returning)
        if self.ended is not None:
            self.ended(request.request_id, now)

    def scraped(self, now: Seconds) -> None:
        """Every worker was just scraped: pressure levels follow their readings."""
        tracker = self.pressure
        if tracker is None:
            return
        changed = False
        for worker in self.workers:
            state = worker.state(now)
            reading = tracker.observe(state, now)
            changed |= worker.set_pressure(reading.level, reading.drain)
        if changed:
            self._wake(now, everyone=True)  # queued requests may fit elsewhere now

    def freed(self, now: Seconds) -> None:
        """Another replica's counts fell (``core.peers``): every waiter asks again, as
        after a release of ours that held KV."""
        if self._queue:
            self._wake(now, everyone=True)

    def _wake(self, now: Seconds, *, everyone: bool) -> None:
        """Waiters ask ``route`` again, most important and oldest first.

        One waiter (``everyone`` False) as a freed slot wakes one live; each
        woken waiter that still has to wait keeps its place and its deadline.
        """
        kept: list[tuple[tuple[int, int], int, _Waiter]] = []
        queue = self._queue
        while queue:
            entry = heapq.heappop(queue)
            waiter = entry[2]
            late = waiter.deadline is not None and waiter.deadline < now
            if late and waiter.held_since is None:
                reason = queue_timeout(self.config, len(queue) + len(kept)).reason
                self._refuse(waiter.request, reason, now)
                continue
            verdict = self._route(waiter, now, len(queue) + len(kept))
            if isinstance(verdict, Queue | Hold):
                self._note_wait(waiter, verdict, now)
                kept.append(entry)
                if not everyone:
                    break
                continue
            self._carry_out(waiter, verdict, now)
            if not everyone:
                break
        for entry in kept:
            heapq.heappush(queue, entry)

    def timer_fired(self, now: Seconds) -> None:
        """Holds whose waits ran out by ``now`` (``timer``) ask again, and only they: a live
        request whose hold runs out wakes nobody else."""
        queue = self._queue
        due = [e for e in queue if e[2].wake_at is not None and e[2].wake_at <= now]
        if not due:
            return
        queue[:] = [e for e in queue if not (e[2].wake_at is not None and e[2].wake_at <= now)]
        heapq.heapify(queue)
        for entry in sorted(due):
            waiter = entry[2]
            waiter.wake_at = None
            verdict = self._route(waiter, now, len(queue))
            if isinstance(verdict, Queue | Hold):
                self._note_wait(waiter, verdict, now)
                heapq.heappush(queue, entry)
            else:
                self._carry_out(waiter, verdict, now)

    def expire_waiters(self, now: Seconds) -> None:
        """Once nothing else can happen: whoever still waits is refused (their wait ran out)."""
        while self._queue:
            waiter = heapq.heappop(self._queue)[2]
            self._refuse(waiter.request, "queue_timeout", now)
