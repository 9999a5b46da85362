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

Every ``share_loads_s`` (``core.peers``) each replica publishes its in-flight counts
per worker to its store and reads the others' (``store.loads.LoadTable``, as
``MemoryStore`` serves it): a replica's snapshot counts what the others had in flight
at the last exchange. Counts change only at the events a replica is told of, so the
exchange is made at the first event past each period's end, before that event: what
everyone published then is what they had at the period's end.

Clients are split between the replicas (``SimConfig.replica_split``): ``client``
sends each conversation (its ``conversation``, else its session id, else the
request alone) to one replica, as a client keeping its connection behind an L4
balancer; ``request`` sends each request to any replica (no stickiness).
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable

from kvgate.core.peers import LOADS_TTL_S, counts_of, encode, others
from kvgate.core.policy import Policy
from kvgate.core.pressure import PressureTracker
from kvgate.engine import FinishedRequest
from kvgate.sim.gateway import SimGateway
from kvgate.sim.worker import SimWorker
from kvgate.store.loads import LoadTable
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
        share_loads_s: Seconds | None = None,
    ) -> None:
        if count < 1:
            raise ValueError("replicas must be at least 1")
        if split not in SPLITS:
            raise ValueError(f"replica_split: one of {', '.join(SPLITS)}, not {split!r}")
        self.split = split
        self.gateways = [first]
        shared = LoadTable()
        self._loads = [shared]  # each replica's store's, in order
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
            self._loads.append(shared if shared_store else LoadTable())
        self._rng = random.Random(seed)
        self._owner: dict[str, SimGateway] = {}
        self._every = share_loads_s
        self._next_share = -1.0 if share_loads_s is not None else math.inf

    def _share(self, now: Seconds) -> None:
        """The loads' exchange of every period ended before ``now`` (module docs)."""
        if now <= self._next_share:
            return
        every = self._every
        assert every is not None
        at = math.floor(now / every) * every  # the last period's end: nothing changed since
        if at >= now:
            at -= every
        self._next_share = at + every
        seen: dict[int, dict[str, bytes]] = {}
        for k, (gateway, table) in enumerate(zip(self.gateways, self._loads, strict=True)):
            own = counts_of(
                (w.id, w.in_flight, w.routed.kv_in_flight_tokens) for w in gateway.workers
            )
            seen[id(table)] = table.exchange(f"replica-{k}", encode(own), at, LOADS_TTL_S)
        for k, (gateway, table) in enumerate(zip(self.gateways, self._loads, strict=True)):
            theirs = others(seen[id(table)], f"replica-{k}")
            fell = False
            for worker in gateway.workers:
                fell |= worker.peered(*theirs.get(worker.id, (0, 0)))
            if fell:
                gateway.freed(now)

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
        self._share(now)
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
        self._share(now)
        gateway = self._of(request_id)
        if gateway is not None:
            gateway.first_token(request_id, now)

    def finished(self, done: FinishedRequest, now: Seconds) -> None:
        self._share(now)
        gateway = self._owner.pop(done.request_id, None) or self._of(done.request_id)
        assert gateway is not None, done.request_id
        gateway.finished(done, now)

    def scraped(self, now: Seconds) -> None:
        """Every replica scrapes the workers (the first's views are the simulation's)."""
        self._share(now)
        for gateway in self.gateways[1:]:
            for worker in gateway.workers:
                worker.scrape(now)
        for gateway in self.gateways:
            gateway.scraped(now)

    def timer_fired(self, now: Seconds) -> None:
        self._share(now)
        for gateway in self.gateways:
            gateway.timer_fired(now)

    def expire_waiters(self, now: Seconds) -> None:
        self._share(now)
        for gateway in self.gateways:
            gateway.expire_waiters(now)
