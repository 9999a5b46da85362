"""Several gateway replicas in front of one fleet (``SimConfig.replicas``).

Each replica is a ``SimGateway`` of its own, as a live replica is a process of its
own: its own policy (what it learned from what *it* sent: the approximate index),
its own admission queue, pressure tracker and in-flight book of each worker (a view
of the worker sharing its engine: a replica counts only what it placed). What the
replicas may share is the store (``SimConfig.shared_store``): the session bindings
(``SessionTable``) and the prefix holders (``HolderTable``, ``core.holders``), as
one ``RedisStore`` shares them live; without it each keeps its own, as replicas each
with a ``MemoryStore`` do. The engines' KV events (``+kv_events``) reach every
replica alike: one exact index serves them all, as a subscriber per replica would
build the same one.

Clients are split between the replicas (``SimConfig.replica_split``): ``client``
sends each conversation (its ``conversation``, else its session id, else the
request alone) to one replica, as a client keeping its connection behind an L4
balancer; ``request`` sends each request to any replica (no stickiness).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

from kvgate.core.policy import Policy
from kvgate.core.pressure import PressureTracker
from kvgate.engine import FinishedRequest
from kvgate.sim.gateway import SimGateway
from kvgate.sim.worker import SimWorker
from kvgate.types import Seconds
from kvgate.workload.request import SimRequest

SPLITS = ("client", "request")


def view(worker: SimWorker) -> SimWorker:
    """Another replica's view of ``worker``: the same engine, an in-flight book of its own."""
    other = SimWorker(
        worker.index,
        worker.engine.config,
        worker_id=worker.id,
        model=worker.routed.model or "",
        max_in_flight=worker.routed.max_in_flight,
        stale_after=worker.stale_after,
        version=worker.version,
        pressure=worker.pressure_config,
    )
    other.engine = worker.engine
    return other


class Replicas:
    """The replicas as the simulation drives one gateway (the module docs)."""

    def __init__(
        self,
        first: SimGateway,
        count: int,
        make_policy: Callable[[], Policy],
        *,
        seed: int,
        shared_store: bool = True,
        split: str = "client",
    ) -> None:
        if count < 1:
            raise ValueError("replicas must be at least 1")
        if split not in SPLITS:
            raise ValueError(f"replica_split: one of {', '.join(SPLITS)}, not {split!r}")
        self.split = split
        self.gateways = [first]
        for k in range(1, count):
            tracker = first.pressure
            gateway = SimGateway(
                [view(w) for w in first.workers],
                make_policy(),
                first.codec,
                first.recorder,
                first.submit,
                config=first.config,
                affinity_ttl=first.ttl,
                rng=random.Random(seed * 1_000 + k),
                versions=first.versions,
                pressure=PressureTracker(tracker.config) if tracker is not None else None,
                ended=first.ended,
                timer=first.timer,
                feed=first.feed,
                attempt_ended=first.attempt_ended,
            )
            if shared_store:
                gateway.table, gateway.holders = first.table, first.holders
            self.gateways.append(gateway)
        self._rng = random.Random(seed)
        self._owner: dict[str, SimGateway] = {}

    # -- what the simulation reads of its gateway -----------------------------------

    @property
    def policy(self) -> Policy:
        """The first replica's policy."""
        return self.gateways[0].policy

    @property
    def misses(self) -> None:
        """Misses are not followed across replicas."""
        return None

    @property
    def queue_depth(self) -> int:
        return sum(g.queue_depth for g in self.gateways)

    @property
    def warm_ups(self) -> int:
        return sum(g.warm_ups for g in self.gateways)

    @property
    def warm_up_tokens(self) -> int:
        return sum(g.warm_up_tokens for g in self.gateways)

    @property
    def warm_up_cached(self) -> int:
        return sum(g.warm_up_cached for g in self.gateways)

    # -- events ---------------------------------------------------------------------

    def replica_of(self, request: SimRequest) -> SimGateway:
        """The replica a request comes through (``split``)."""
        gateways = self.gateways
        if self.split == "request":
            return gateways[self._rng.randrange(len(gateways))]
        client = request.conversation or request.session_id or request.request_id
        return gateways[zlib.crc32(client.encode()) % len(gateways)]

    def arrive(self, request: SimRequest, now: Seconds) -> None:
        gateway = self.replica_of(request)
        self._owner[request.request_id] = gateway
        gateway.arrive(request, now)

    def _of(self, request_id: str) -> SimGateway | None:
        gateway = self._owner.get(request_id)
        if gateway is not None:
            return gateway
        # A warm-up: its id is the replica's own.
        return next((g for g in self.gateways if request_id in g.warm_flights), None)

    def first_token(self, request_id: str, now: Seconds) -> None:
        gateway = self._of(request_id)
        if gateway is not None:
            gateway.first_token(request_id, now)

    def finished(self, done: FinishedRequest, now: Seconds) -> None:
        gateway = self._owner.pop(done.request_id, None) or self._of(done.request_id)
        assert gateway is not None, done.request_id
        gateway.finished(done, now)

    def scraped(self, now: Seconds) -> None:
        """Every replica scrapes the workers (the first's views are the simulation's)."""
        for gateway in self.gateways[1:]:
            for worker in gateway.workers:
                worker.scrape(now)
        for gateway in self.gateways:
            gateway.scraped(now)

    def timer_fired(self, now: Seconds) -> None:
        for gateway in self.gateways:
            gateway.timer_fired(now)

    def expire_waiters(self, now: Seconds) -> None:
        for gateway in self.gateways:
            gateway.expire_waiters(now)
