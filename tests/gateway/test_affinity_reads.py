"""The store's binding is read only when something reads it (``core.route.needs_affinity``).

A policy that never reads bindings, on a model whose versions are not split and a
fleet without pressure or a full worker, makes no store lookup and no touch; each
of those conditions brings the lookup back, and with it the behaviour it serves:
a bound session kept on its soft-pressured worker, a canary session kept on its
version.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest

from kvgate.core.admission import AdmissionConfig
from kvgate.core.decision import Affinity
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import FleetSnapshot, Pressure, WorkerState
from kvgate.core.policies import default_registry
from kvgate.core.policy import Policy
from kvgate.core.route import RouteConfig, needs_affinity
from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.control.config import ModelVersionsConfig
from kvgate.gateway.control.versions import VersionRegistry
from kvgate.gateway.dataplane.errors import OverloadedError
from kvgate.gateway.dataplane.queue import AdmissionQueue
from kvgate.gateway.dataplane.router import UNREAD, Router
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.observe.scrape import WorkerSignals
from kvgate.gateway.routing import Routing
from kvgate.store import MemoryStore
from kvgate.store.base import AffinityStore
from kvgate.testing import wait_until
from kvgate.types import BlockHash, Priority, Seconds, SessionKey, WorkerId

MONO = 100.0


class CountingStore(MemoryStore):
    """A memory store that counts binding reads and touches."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0
        self.touches = 0
        self.holder_reads = 0
        self.holder_writes = 0

    async def get(self, key: SessionKey) -> Affinity | None:
        self.gets += 1
        return await super().get(key)

    async def touch(self, key: SessionKey, now: Seconds, ttl: Seconds) -> bool:
        self.touches += 1
        return await super().touch(key, now, ttl)

    async def get_holders(self, blocks: Sequence[BlockHash]) -> list[WorkerId | None]:
        self.holder_reads += 1
        return await super().get_holders(blocks)

    async def set_holders(
        self, entries: Sequence[tuple[BlockHash, WorkerId]], ttl: Seconds, tenant: str = ""
    ) -> None:
        self.holder_writes += 1
        await super().set_holders(entries, ttl, tenant)

    def set_holders_soon(
        self,
        entries: Sequence[tuple[BlockHash, WorkerId]],
        ttl: Seconds,
        failed: Callable[[], None],
        tenant: str = "",
    ) -> None:
        self.holder_writes += 1
        super().set_holders_soon(entries, ttl, failed, tenant)


def _state(wid: str, pressure: Pressure = Pressure.NORMAL, in_flight: int = 0) -> WorkerState:
    return WorkerState(id=wid, model="m", pressure=pressure, in_flight=in_flight, max_in_flight=4)


@pytest.mark.parametrize(
    ("policy", "states", "split", "needed"),
    [
        ("round_robin", [_state("a"), _state("b")], False, False),
        ("least_request", [_state("a"), _state("b")], False, False),
        ("random", [_state("a"), _state("b")], False, False),
        ("round_robin", [_state("a"), _state("b")], True, True),  # a canary split
        ("round_robin", [_state("a", Pressure.SOFT), _state("b")], False, True),
        ("round_robin", [_state("a", Pressure.HARD), _state("b")], False, True),
        ("round_robin", [_state("a", in_flight=4), _state("b")], False, True),  # full
        ("session_affinity", [_state("a"), _state("b")], False, True),
        ("default", [_state("a"), _state("b")], False, True),
    ],
)
def test_the_binding_is_needed_only_when_something_reads_it(
    policy: str, states: list[WorkerState], split: bool, needed: bool
) -> None:
    built: Policy = default_registry().build(policy)
    assert needs_affinity(built, FleetSnapshot(0.0, tuple(states)), split) is needed


def make_router(
    store: MemoryStore,
    policy: str,
    *,
    pressure: tuple[Pressure, Pressure] = (Pressure.NORMAL, Pressure.NORMAL),
    versions: tuple[str, str] = ("v1", "v1"),
    weights: dict[str, float] | None = None,
) -> Router:
    """A router over two probed, scraped workers (no upstream: ``place`` and ``finished``)."""
    workers = []
    for i in range(2):
        config = WorkerConfig(url=f"http://w{i}:8000", model="m", version=versions[i])
        worker = Worker(config, upstream=None)  # type: ignore[arg-type]
        worker.update(
            max_in_flight=4,
            probe_ok=True,
            pressure=pressure[i],
            signals=WorkerSignals(running=0, waiting=0, kv_usage=0.0, kv_capacity_tokens=1000),
            signals_at=MONO,
        )
        workers.append(worker)
    pool = WorkerPool(workers, stale_after=1e9, queue=AdmissionQueue(16))
    registry = None
    if weights is not None:
        registry = VersionRegistry(pool, {"m": ModelVersionsConfig(weights=weights)})
    return Router(
        pool,
        Routing.of(default_registry().build(policy)),
        store,
        GatewayMetrics(),
        RouteConfig(AdmissionConfig()),
        affinity_ttl=60.0,
        rng=random.Random(0),
        mono=lambda: MONO,
        versions=registry,
    )


def features(key: str | None = "s1", rid: str = "r1") -> RequestFeatures:
    return RequestFeatures(request_id=rid, model="m", session_key=key)


def turn(rid: str, blocks: int, priority: Priority = Priority.STANDARD) -> RequestFeatures:
    """A headerless conversation's turn: its chain of ``blocks`` prefix blocks, all shared."""
    hashes = tuple(BlockHash(1000 + i) for i in range(blocks))
    return RequestFeatures(
        request_id=rid,
        model="m",
        prefix_hashes=hashes,
        checkpoints=tuple(range(blocks)),
        priority=priority,
    )


async def serve(router: Router, request: RequestFeatures) -> str:
    """Look up, place and finish one request as the proxy does; the worker placed on.

    The proxy shares the prefix state once the request is written to the worker.
    """
    looked = await router.lookup(request)
    attempt = await router.place(request, looked)
    async with attempt:
        attempt.sent()
        attempt.usage(10, 0, 0)
        attempt.completed()
    await attempt.refresh()
    return attempt.worker.id


async def test_a_policy_that_ignores_bindings_on_a_quiet_fleet_never_reads_the_store() -> None:
    store = CountingStore()
    router = make_router(store, "round_robin")
    assert await router.lookup(features()) is UNREAD
    for i in range(4):
        await serve(router, features(rid=f"r{i}"))
    assert (store.gets, store.touches) == (0, 0)


async def test_a_policy_that_reads_bindings_reads_and_touches_them() -> None:
    store = CountingStore()
    router = make_router(store, "session_affinity")
    first = await serve(router, features(rid="r1"))
    second = await serve(router, features(rid="r2"))
    assert first == second  # the binding held
    assert store.gets == 2
    assert store.touches == 1  # the second request refreshed the first one's binding


async def test_under_soft_pressure_a_bound_session_keeps_its_worker() -> None:
    """The soft-pressured worker takes only sessions bound to it: the lookup must happen."""
    store = CountingStore()
    router = make_router(store, "round_robin", pressure=(Pressure.SOFT, Pressure.NORMAL))
    pressured = router.pool.snapshot("m", 0.0, MONO).workers[0].id
    await store.compare_and_set(SessionKey("s1"), None, Affinity("s1", pressured, "v1", 0.0), 60)
    placed = {await serve(router, features(rid=f"r{i}")) for i in range(4)}
    assert store.gets == 4
    assert store.touches == 4
    # Round robin ignores the binding, but the soft-pressured worker stays a candidate
    # for its own session only: without the lookup it would never be chosen.
    assert pressured in placed


async def test_a_split_model_reads_the_binding_so_a_session_keeps_its_version() -> None:
    store = CountingStore()
    router = make_router(store, "round_robin", versions=("v1", "v2"), weights={"v1": 1, "v2": 1})
    await store.compare_and_set(
        SessionKey("s1"), None, Affinity("s1", "http://w1:8000", "v2", 0.0), 60
    )
    versions = set()
    for i in range(6):
        attempt = await router.place(features(rid=f"r{i}"), UNREAD)
        attempt.cancelled()
        versions.add(attempt.version)
    assert versions == {"v2"}
    assert store.gets == 6  # ``place`` reads what ``lookup`` left unread once a split exists


async def test_the_prefix_state_is_written_unread_and_spares_a_later_turn_under_pressure() -> None:
    """Without pressure nothing reads the shared prefix state, but each request still
    writes it: once every worker is soft-pressured, a headerless conversation's later
    turn is known as continued (not shed as a new session), a sheddable stranger is
    shed (a standard one is placed: ``core.pressure.unpressured``)."""
    store = CountingStore()
    router = make_router(store, "round_robin")
    await serve(router, turn("t1", 4))
    assert (store.holder_reads, store.holder_writes) == (0, 1)
    for worker in router.pool:
        worker.update(pressure=Pressure.SOFT)
    await serve(router, turn("t2", 6, Priority.SHEDDABLE))  # the same conversation, later
    assert store.holder_reads == 1
    stranger = RequestFeatures(
        request_id="x",
        model="m",
        prefix_hashes=tuple(BlockHash(9000 + i) for i in range(4)),
        checkpoints=(0, 1, 2, 3),
        priority=Priority.SHEDDABLE,
    )
    with pytest.raises(OverloadedError):
        await router.place(stranger, UNREAD)


async def test_the_prefix_state_is_written_by_share_once_not_by_place() -> None:
    """``place`` only notes the writes (the proxy shares them once the request is written
    to its worker); ``share`` writes them once and readably at once with the memory store."""
    store = CountingStore()
    router = make_router(store, "round_robin")
    request = turn("t1", 3)
    attempt = await router.place(request, UNREAD)
    assert store.holder_writes == 0 and len(attempt.shares) == 3
    attempt.sent()
    attempt.sent()
    assert store.holder_writes == 1 and attempt.shares == ()
    assert await store.get_holders(list(request.prefix_hashes)) == [attempt.worker.id] * 3
    attempt.cancelled()


class _FailingWrites(MemoryStore):
    """A store whose prefix-state writes fail, written through the base class's task."""

    async def set_holders(
        self, entries: Sequence[tuple[BlockHash, WorkerId]], ttl: Seconds, tenant: str = ""
    ) -> None:
        raise ConnectionError("store down")

    def set_holders_soon(
        self,
        entries: Sequence[tuple[BlockHash, WorkerId]],
        ttl: Seconds,
        failed: Callable[[], None],
        tenant: str = "",
    ) -> None:
        AffinityStore.set_holders_soon(self, entries, ttl, failed, tenant)


async def test_a_failed_background_prefix_write_is_counted_never_raised() -> None:
    router = make_router(_FailingWrites(), "round_robin")
    attempt = await router.place(turn("t1", 2), UNREAD)
    attempt.sent()  # returns at once; the write fails in its task
    errors = router.metrics.store_errors.labels("set_holders")
    await wait_until(lambda: errors._value.get() == 1, timeout=5.0)
    attempt.cancelled()
