"""The discrete-event loop: workload arrivals, engine steps and metric scrapes in virtual time.

Events are ``(time, counter, kind, worker)`` in a heap; the counter breaks ties so
a run is a pure function of its inputs (as SimPy's event queue). Arrivals are
pulled from the workload one at a time, so memory is bounded by the fleet.

Each worker alternates ``engine.step(now, horizon)`` and the step's end. The
horizon is the time to the next arrival (or, while requests wait in the
gateway's queue or at the clients for an end to release them, to the next event
of any kind): nothing can reach the engine before then, so fusing decode-only
iterations up to it changes no result.
A request held for KV headroom asks again when its hold's wait runs out (a timer
event), as the live router's does, not only when a release wakes it.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kvgate.core.admission import AdmissionConfig
from kvgate.core.peers import LOADS_EVERY_S
from kvgate.core.policies import default_registry, with_feature_blocks
from kvgate.core.prefix import FeatureConfig
from kvgate.core.pressure import PressureConfig, PressureTracker
from kvgate.core.route import RouteConfig
from kvgate.core.versions import ModelVersions, VersionWeights
from kvgate.engine import EngineConfig, EngineRequest, StepResult
from kvgate.sim.arrivals import Arrivals
from kvgate.sim.gateway import SimGateway
from kvgate.sim.kvfeed import KVFeed, split_policy
from kvgate.sim.replicas import Replicas
from kvgate.sim.worker import SimWorker
from kvgate.types import Seconds
from kvgate.workload.misses import Misses
from kvgate.workload.pinned import Span
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.recorder import RunRecorder
from kvgate.workload.request import SimRequest

_STEP = 0
_SCRAPE = 1
_TIMER = 2  # a hold's wait ran out (``SimGateway.timer``)
_SPEED = 3  # a worker's device changes speed (``SimConfig.slowdowns``)
_NO_ARRIVAL_HORIZON = 3600.0  # fuse freely once the workload is exhausted

Progress = Callable[[int], None]


@dataclass(frozen=True)
class SimConfig:
    """The fleet and the gateway's settings for one run.

    ``profiles`` and ``kv_blocks`` are assigned to workers in turn (worker i gets
    ``profiles[i % len(profiles)]``), so ``("h100-llama3-8b", "a100-llama3-8b")``
    makes a mixed fleet. ``kv_blocks`` 0 means what the profile's GPU holds.
    ``scrape_interval`` is how often worker metrics refresh (the live gateway's
    health interval); signals older than ``stale_after`` count as unknown.

    As the live gateway's defaults: ``pressure`` (watermarks; ``None`` turns
    pressure handling off) sets each worker's level from its scraped KV and GPU
    readings and counts each request's KV demand in flight; with its
    ``kv_gate``, requests are held up to ``kv_gate_max_wait_s`` for KV headroom.
    ``versions`` are assigned to workers in turn; ``version_weights`` (pairs of
    version and weight, ``()``: not split) split the model's traffic between
    them as the live ``models:`` config does, so a canary's share can be run.
    With ``turns_wait`` (the default) a later turn that re-sends a reply waits for
    the request producing it to end, as a client and the live replay must
    (``sim.arrivals``); off, every request comes at its arrival (an open loop).
    ``client_concurrency`` caps the requests the clients have out at once, as the live
    replay's ``--concurrency`` does (``None``: no cap); a request due past it waits.
    ``worker_ids`` names the workers (default ``sim-w00``, ``sim-w01``, ...): a policy
    that hashes or breaks ties on a worker's id (``consistent_hash``'s rendezvous
    order) places a key where a live fleet of those ids would.
    ``slowdowns`` are ``(at, worker index, speed)``: from model second ``at`` that
    worker's engine runs at ``speed`` times its profile's rate (0.5: a GPU throttled to
    half speed mid-run), as ``POST /admin/faults {"speed": 0.5}`` does to a live one.
    """

    workers: int = 4
    profiles: tuple[str, ...] = ("h100-llama3-8b",)
    kv_blocks: tuple[int, ...] = (0,)
    block_size: int = 64
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048
    scrape_interval: Seconds = 2.0
    stale_after: Seconds | None = None
    affinity_ttl: Seconds = 3600.0
    admission: AdmissionConfig = field(default_factory=lambda: AdmissionConfig.model_validate({}))
    features: FeatureConfig = field(default_factory=lambda: FeatureConfig.model_validate({}))
    pressure: PressureConfig | None = field(default_factory=PressureConfig)
    kv_gate_max_wait_s: Seconds = 10.0
    versions: tuple[str, ...] = ("default",)
    version_weights: tuple[tuple[str, float], ...] = ()
    seed: int = 0
    max_requests: int | None = None
    duration: Seconds | None = None
    model: str = "sim"
    turns_wait: bool = True
    worker_ids: tuple[str, ...] = ()
    client_concurrency: int | None = None
    slowdowns: tuple[tuple[Seconds, int, float], ...] = ()
    kv_event_drop: float = 0.0
    """With a ``+kv_events`` policy: the share of event batches the link loses (``sim.kvfeed``)."""
    subscriber_restarts: tuple[Seconds, ...] = ()
    """With a ``+kv_events`` policy: when the event subscriber is killed and restarted."""
    worker_restarts: tuple[tuple[Seconds, int], ...] = ()
    """(when, worker index) a worker restarts, its cache cleared (any policy; with a
    ``+kv_events`` one its publisher starts over too)."""
    cpu_offload_blocks: int = 0
    """Each worker's CPU offload tier, in blocks (vLLM's CPU offload, LMCache): what a
    gateway's offload moves KV to (0: none, an offload drops it)."""
    replicas: int = 1
    """Gateway replicas in front of the fleet (``sim.replicas``), clients split between them."""
    shared_store: bool = True
    """With ``replicas``: they share the store (session bindings, prefix holders)."""
    replica_split: str = "client"
    """With ``replicas``: ``client`` (a conversation through one) or ``request`` (any)."""
    share_loads_s: Seconds | None = LOADS_EVERY_S
    """With ``replicas``: how often each publishes its in-flight counts to its store and
    reads the others' (``core.peers``); ``None``: never, each counts only its own."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("the fleet needs at least one worker")
        if self.worker_ids and len(self.worker_ids) != self.workers:
            raise ValueError(f"worker_ids names {len(self.worker_ids)} workers, not {self.workers}")
        if len(set(self.worker_ids)) != len(self.worker_ids) or not all(self.worker_ids):
            raise ValueError("worker_ids must be distinct and non-empty")
        if not self.profiles or not self.kv_blocks:
            raise ValueError("profiles and kv_blocks need at least one value each")
        if self.scrape_interval <= 0:
            raise ValueError("scrape_interval must be positive")
        if not self.versions:
            raise ValueError("versions needs at least one value")
        for at, index, speed in self.slowdowns:
            if not (0 <= index < self.workers and at >= 0 and speed > 0):
                raise ValueError(f"slowdown ({at}, {index}, {speed}): bad time, worker or speed")
        unknown = {name for name, _ in self.version_weights} - set(self.versions)
        if unknown:
            raise ValueError(f"no worker serves version(s) {', '.join(sorted(unknown))}")

    def model_versions(self) -> ModelVersions | None:
        """The model's split by version, or ``None`` when it is not split."""
        if not self.version_weights:
            return None
        weights = VersionWeights(self.version_weights)
        stable = min(weights, key=lambda name: (-weights[name], name))
        return ModelVersions(self.model, weights, stable)

    def route_config(self) -> RouteConfig:
        """What ``core.route`` reads, as the live gateway builds it from the same settings."""
        pressure = self.pressure
        gate = pressure if pressure is not None and pressure.kv_gate else None
        return RouteConfig(self.admission, gate, self.kv_gate_max_wait_s)

    def worker_id(self, index: int) -> str:
        """Worker ``index``'s id."""
        return self.worker_ids[index] if self.worker_ids else f"sim-w{index:02d}"

    def engine_config(self, index: int) -> EngineConfig:
        """The engine config of worker ``index``."""
        return EngineConfig(
            block_size=self.block_size,
            num_gpu_blocks=self.kv_blocks[index % len(self.kv_blocks)],
            max_num_seqs=self.max_num_seqs,
            max_batched_tokens=self.max_batched_tokens,
            profile=self.profiles[index % len(self.profiles)],
            cpu_offload_blocks=self.cpu_offload_blocks,
        )

    def limited(self, requests: Iterable[SimRequest]) -> Iterator[SimRequest]:
        """``requests`` cut at ``max_requests`` and at arrivals past ``duration``."""
        stream: Iterator[SimRequest] = iter(requests)
        if self.duration is not None:
            stream = itertools.takewhile(lambda r: r.arrival <= (self.duration or 0.0), stream)
        if self.max_requests is not None:
            stream = itertools.islice(stream, self.max_requests)
        return stream


@dataclass
class RunResult:
    """One policy's run: its name and options, the summary, and the raw recorder."""

    policy: str
    options: dict[str, Any]
    summary: dict[str, Any]
    recorder: RunRecorder
    wall_s: float = 0.0  # wall-clock seconds the run took; never part of results.json
    spans: dict[str, Span] = field(default_factory=dict)
    """Request id -> when it ran (first token, last token) and on which worker index:
    the timing of the replays in which running requests pin KV (``workload.pinned``)."""


class Simulation:
    """One run of one policy over one workload on a fresh fleet."""

    def __init__(
        self,
        config: SimConfig,
        requests: Iterable[SimRequest],
        policy: str,
        options: dict[str, Any] | None = None,
        codec: PromptCodec | None = None,
        *,
        misses: bool = False,
    ) -> None:
        self.config = config
        self.policy_name = policy
        self.options = dict(options or {})
        self.codec = codec or PromptCodec(config.block_size, config.features, model=config.model)
        stale = config.stale_after if config.stale_after is not None else 3 * config.scrape_interval
        max_in_flight = config.admission.worker_max_in_flight
        self.workers = [
            SimWorker(
                i,
                config.engine_config(i),
                worker_id=config.worker_id(i),
                model=config.model,
                version=config.versions[i % len(config.versions)],
                max_in_flight=max_in_flight,
                stale_after=stale,
                pressure=config.pressure,
            )
            for i in range(config.workers)
        ]
        self.recorder = RunRecorder([w.id for w in self.workers])
        registry = default_registry()
        base, exact = split_policy(policy)
        # As the live gateway does: the prefix index counts the features' blocks.
        options = with_feature_blocks(registry, base, self.options, config.features)
        self.feed = (
            KVFeed(
                {w.id: w.engine for w in self.workers},
                config.block_size,
                drop=config.kv_event_drop,
                seed=config.seed,
            )
            if exact
            else None
        )
        self._faults = sorted(
            [(at, -1) for at in config.subscriber_restarts] + list(config.worker_restarts)
        )
        self.gateway: SimGateway | Replicas = SimGateway(
            self.workers,
            registry.build(base, options),
            self.codec,
            self.recorder,
            self._submit,
            config=config.route_config(),
            affinity_ttl=config.affinity_ttl,
            rng=random.Random(config.seed),
            versions=config.model_versions(),
            pressure=PressureTracker(config.pressure) if config.pressure is not None else None,
            misses=Misses(config.block_size) if misses else None,
            ended=self._ended,
            timer=lambda at: self._push(at, _TIMER, -1),
            feed=self.feed,
        )
        if config.replicas > 1:
            self.gateway = Replicas(
                self.gateway,
                config.replicas,
                lambda: registry.build(base, options),
                seed=config.seed,
                shared_store=config.shared_store,
                split=config.replica_split,
                share_loads_s=config.share_loads_s,
            )
        self._arrivals = Arrivals(
            config.limited(requests),
            turns_wait=config.turns_wait,
            concurrency=config.client_concurrency,
        )
        self._events: list[tuple[Seconds, int, int, int]] = []
        self._counter = itertools.count()
        self._pending: list[StepResult | None] = [None] * len(self.workers)
        self._next_scrape: Seconds = 0.0
        self._next_speed_change = math.inf
        self.step_calls = 0  # engine.step calls that ran something (a cost measure)
        self.spans: dict[str, Span] = {}

    def _push(self, at: Seconds, kind: int, worker: int) -> None:
        heapq.heappush(self._events, (at, next(self._counter), kind, worker))

    def _ended(self, request_id: str, now: Seconds) -> None:
        self._arrivals.ended(request_id, now)

    def _submit(self, worker: SimWorker, request: EngineRequest, now: Seconds) -> None:
        worker = self.workers[worker.index]  # another replica's view of it: the worker
        worker.engine.submit(request, now)
        if not worker.busy:
            worker.busy = True
            self._push(now, _STEP, worker.index)

    def run(self, progress: Progress | None = None, every: int = 500) -> RunResult:
        """Run until every request has finished or been refused."""
        started = time.perf_counter()
        events = self._events
        gateway = self.gateway
        arrivals = self._arrivals
        self._push(0.0, _SCRAPE, -1)
        for n, (at, _, _) in enumerate(self.config.slowdowns):
            self._push(at, _SPEED, n)
            self._next_speed_change = min(self._next_speed_change, at)
        arrived = 0
        now = 0.0
        while True:
            upcoming = arrivals.upcoming
            if events and (upcoming is None or events[0][0] <= upcoming.arrival):
                now, _, kind, index = heapq.heappop(events)
                if kind == _STEP:
                    self._step(self.workers[index], now)
                elif kind == _TIMER:
                    gateway.timer_fired(now)
                elif kind == _SPEED:
                    self._change_speed(index, now)
                else:
                    self._scrape(now)
            elif upcoming is not None:
                request = arrivals.take()
                if request is None:
                    continue  # a later turn, held until its previous turn ends
                now = request.arrival
                if self._faults and self._faults[0][0] <= now:
                    self._fault(self._faults.pop(0)[1])
                gateway.arrive(request, now)
                arrived += 1
                if progress is not None and arrived % every == 0:
                    progress(arrived)
            elif gateway.queue_depth:
                gateway.expire_waiters(now)  # their next turns may come now
            else:
                break
        if progress is not None:
            progress(arrived)
        summary = self.recorder.summary()
        if self.gateway.misses is not None:
            summary["misses"] = self.gateway.misses.summary()
        summary["turns_held"] = arrivals.held
        summary["client_queued"] = arrivals.queued
        summary["warm_ups"] = self.gateway.warm_ups
        summary["warm_up_tokens"] = self.gateway.warm_up_tokens
        summary["warm_up_cached_tokens"] = self.gateway.warm_up_cached
        if self.feed is not None:
            summary["kv_events"] = self.feed.summary()
        wall = time.perf_counter() - started
        return RunResult(self.policy_name, self.options, summary, self.recorder, wall, self.spans)

    def _change_speed(self, n: int, now: Seconds) -> None:
        """Slowdown ``n`` takes effect: later steps of its worker run at its speed."""
        _, index, speed = self.config.slowdowns[n]
        self.workers[index].engine.set_speed(speed)
        later = [at for at, _, _ in self.config.slowdowns if at > now]
        self._next_speed_change = min(later, default=math.inf)

    def _fault(self, worker: int) -> None:
        """A fault: the KV events' subscriber restarts (-1), or a worker does (its
        cache cleared, whether or not a feed tells anyone)."""
        if self.feed is None:
            if worker >= 0:
                self.workers[worker].engine.reset_prefix_cache()
            return
        if worker < 0:
            self.feed.restart_subscriber()
        else:
            self.feed.restart_worker(self.workers[worker].id)

    def _horizon(self, now: Seconds) -> Seconds:
        """How far this worker may fuse decode steps: until anything could reach it."""
        upcoming = self._arrivals.upcoming
        horizon = upcoming.arrival - now if upcoming is not None else _NO_ARRIVAL_HORIZON
        # The next scrape must read the engine as it is then, not after a fused step.
        horizon = min(horizon, self._next_scrape - now, self._next_speed_change - now)
        if (self.gateway.queue_depth or self._arrivals.releasable) and self._events:
            # A finish elsewhere would hand a waiter to any worker, this one included, or
            # release a client's request (a held turn, one due past the concurrency cap).
            horizon = min(horizon, self._events[0][0] - now)
        return max(horizon, 0.0)

    def _step(self, worker: SimWorker, now: Seconds) -> None:
        """The worker's previous step ends at ``now``: deliver it, start the next."""
        index = worker.index
        pending = self._pending
        events = self._events
        engine = worker.engine
        while True:
            result = pending[index]
            pending[index] = None
            if result is not None:
                if result.preempted:
                    self.recorder.preemptions += len(result.preempted)
                for request_id, _ in result.first_tokens:
                    self.gateway.first_token(request_id, now)
                for done in result.finished:
                    self.spans[done.request_id] = (
                        done.first_token_time,
                        done.finish_time,
                        index,
                    )
                    self.gateway.finished(done, now)
            if not engine.has_work():
                break
            result = engine.step(now, self._horizon(now))
            if self.feed is not None:
                self.feed.pump(now, worker.id)
            if not result.steps:
                break
            self.step_calls += 1
            pending[index] = result
            end = now + result.duration
            upcoming = self._arrivals.upcoming
            if (events and events[0][0] <= end) or (
                upcoming is not None and upcoming.arrival <= end
            ):
                heapq.heappush(events, (end, next(self._counter), _STEP, index))
                return
            # Nothing else happens before this step ends: deliver it without the heap.
            now = end
        worker.busy = False

    def _scrape(self, now: Seconds) -> None:
        """Every worker's metrics are read; the next scrape is scheduled while work remains."""
        workers = self.workers
        for worker in workers:
            worker.scrape(now)
        self.gateway.scraped(now)
        self.recorder.load.sample(
            now,
            [w.in_flight for w in workers],
            [w.kv_usage for w in workers],
        )
        interval = self.config.scrape_interval
        busy = any(w.busy for w in workers) or self.gateway.queue_depth > 0
        upcoming = self._arrivals.upcoming
        self._next_scrape = _NO_ARRIVAL_HORIZON + now
        if busy:
            self._next_scrape = now + interval
        elif upcoming is not None:
            # An idle fleet's signals do not change: skip to the last scrape before
            # the next arrival, on the same grid.
            skips = max(1, math.floor((upcoming.arrival - now) / interval))
            self._next_scrape = now + skips * interval
        else:
            return
        self._push(self._next_scrape, _SCRAPE, -1)
