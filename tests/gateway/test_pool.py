"""The pool's cached snapshots: every change routing reads shows in the next snapshot."""

from __future__ import annotations

import dataclasses

import pytest

from kvgate.core.fleet import FleetSnapshot, Health, Pressure
from kvgate.core.pressure import PressureConfig
from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.dataplane.queue import AdmissionQueue
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.observe.scrape import WorkerSignals

STALE = 3.0


def make_pool(*versions: str, now: float = 100.0) -> tuple[WorkerPool, list[Worker]]:
    """Probed workers of model ``m`` with signals scraped at ``now``, one per version."""
    workers = []
    for i, version in enumerate(versions):
        config = WorkerConfig(url=f"http://w{i}:8000", model="m", version=version)
        worker = Worker(config, upstream=None)  # type: ignore[arg-type]
        worker.update(
            probe_ok=True,
            signals=WorkerSignals(running=1, waiting=0, kv_usage=0.5),
            signals_at=now,
        )
        workers.append(worker)
    return WorkerPool(workers, stale_after=STALE, queue=AdmissionQueue(8)), workers


def fresh(pool: WorkerPool, wall: float, mono: float, version: str | None = None) -> FleetSnapshot:
    """The snapshot the pool would build with no cache at all."""
    members = [w for w in pool if w.model == "m" and version in (None, w.version)]
    return FleetSnapshot(
        wall, tuple(w.state(mono, pool.stale_after, pool.pressure) for w in members)
    )


def test_in_flight_changes_show_in_the_next_snapshot() -> None:
    pool, (a, _) = make_pool("v1", "v1")
    first = pool.snapshot("m", 1.0, 100.0)
    lease = pool.lease(a, kv_tokens=10)
    second = pool.snapshot("m", 2.0, 100.0)
    assert first.get(a.id).in_flight == 0  # type: ignore[union-attr]
    assert second.get(a.id).in_flight == 1  # type: ignore[union-attr]
    assert second.workers[0].kv_in_flight_tokens == 10
    assert second.now == 2.0
    assert second == fresh(pool, 2.0, 100.0)
    assert lease.release() and not lease.release()  # given back exactly once
    assert pool.snapshot("m", 3.0, 100.0) == fresh(pool, 3.0, 100.0)


def test_an_unchanged_fleet_shares_its_workers_between_snapshots() -> None:
    pool, _ = make_pool("v1", "v1")
    first = pool.snapshot("m", 1.0, 100.0)
    second = pool.snapshot("m", 2.0, 100.5)
    assert second.workers is first.workers
    assert second.now == 2.0


def test_health_pressure_and_scrapes_show_in_the_next_snapshot() -> None:
    pool, (a, b) = make_pool("v1", "v1")
    pool.snapshot("m", 0.0, 100.0)
    a.update(ejected=True)
    b.update(pressure=Pressure.SOFT)
    snap = pool.snapshot("m", 0.0, 100.0)
    assert [w.health for w in snap.workers] == [Health.EJECTED, Health.HEALTHY]
    assert snap.workers[1].pressure is Pressure.SOFT
    b.update(signals=WorkerSignals(running=7, waiting=2, kv_usage=0.9))
    assert pool.snapshot("m", 0.0, 100.0).workers[1].waiting == 2
    b.update(draining=True)
    assert pool.snapshot("m", 0.0, 100.0) == fresh(pool, 0.0, 100.0)


def test_signals_go_stale_with_time_alone() -> None:
    pool, (_, b) = make_pool("v1", "v1")
    b.update(signals_at=102.0)
    assert [w.health for w in pool.snapshot("m", 0.0, 103.0).workers] == [Health.HEALTHY] * 2
    later = pool.snapshot("m", 0.0, 104.0)
    assert [w.health for w in later.workers] == [Health.DEGRADED, Health.HEALTHY]
    assert later.workers[0].kv_usage is None
    # A clock that goes back (a test's) still gets the states for its time.
    assert pool.snapshot("m", 0.0, 101.0) == fresh(pool, 0.0, 101.0)
    assert pool.snapshot("m", 0.0, 110.0) == fresh(pool, 0.0, 110.0)


def test_a_version_snapshot_holds_only_that_versions_workers() -> None:
    pool, (a, b, c) = make_pool("v1", "v2", "v1")
    assert [w.id for w in pool.snapshot("m", 0.0, 100.0, "v1").workers] == [a.id, c.id]
    pool.lease(c)
    assert pool.snapshot("m", 0.0, 100.0, "v1") == fresh(pool, 0.0, 100.0, "v1")
    assert pool.snapshot("m", 0.0, 100.0, "v2") == fresh(pool, 0.0, 100.0, "v2")
    b.update(version="v1")  # a worker that moves version moves snapshot
    assert len(pool.snapshot("m", 0.0, 100.0, "v1").workers) == 3
    assert pool.snapshot("m", 0.0, 100.0, "v2").workers == ()


def test_membership_and_config_changes_show_in_the_next_snapshot() -> None:
    pool, (a, _) = make_pool("v1", "v1")
    pool.snapshot("m", 0.0, 100.0)
    extra = Worker(WorkerConfig(url="http://w9:8000", model="m"), upstream=None)  # type: ignore[arg-type]
    extra.update(probe_ok=True)
    pool.add(extra)
    assert len(pool.snapshot("m", 0.0, 100.0).workers) == 3
    pool.remove(a.id)
    assert a.id not in {w.id for w in pool.snapshot("m", 0.0, 100.0).workers}
    pool.lease(a)  # a removed worker no longer counts anywhere
    assert pool.snapshot("m", 0.0, 100.0) == fresh(pool, 0.0, 100.0)
    pool.stale_after = 0.5
    assert pool.snapshot("m", 0.0, 101.0) == fresh(pool, 0.0, 101.0)


def test_the_in_flight_kv_estimate_raises_pressure_when_the_pool_has_watermarks() -> None:
    workers = make_pool("v1")[1]
    workers[0].update(
        signals=WorkerSignals(running=0, waiting=0, kv_usage=0.0, kv_capacity_tokens=100)
    )
    pool = WorkerPool(
        workers, stale_after=STALE, queue=AdmissionQueue(8), pressure=PressureConfig()
    )
    pool.snapshot("m", 0.0, 100.0)
    lease = pool.lease(workers[0], kv_tokens=90)
    state = pool.snapshot("m", 0.0, 100.0).workers[0]
    assert state.pressure is Pressure.SOFT
    assert pool.snapshot("m", 0.0, 100.0) == fresh(pool, 0.0, 100.0)
    lease.release()
    assert pool.snapshot("m", 0.0, 100.0).workers[0].pressure is Pressure.NORMAL


def test_leases_between_other_changes_match_a_pool_without_cache() -> None:
    # A lease's state is copied from the worker's last one (``reloaded``): a change
    # of anything else between leases, or signals going stale, must still show.
    workers = make_pool("v1", "v1")[1]
    for w in workers:
        w.update(signals=WorkerSignals(running=0, waiting=0, kv_usage=0.1, kv_capacity_tokens=100))
    pool = WorkerPool(
        workers, stale_after=STALE, queue=AdmissionQueue(8), pressure=PressureConfig()
    )
    a, b = workers
    steps = [
        lambda: pool.lease(a, kv_tokens=40),
        lambda: pool.lease(a, kv_tokens=50),  # a is SOFT by its in-flight KV now
        lambda: a.update(pressure=Pressure.HARD),
        lambda: pool.lease(b),
        lambda: b.update(draining=True),
        lambda: pool.lease(b, kv_tokens=5),
        lambda: a.update(pressure=Pressure.NORMAL),
        lambda: pool.lease(a, kv_tokens=1).release(),
    ]
    for mono in (100.0, 104.0):  # fresh signals, then stale ones
        for step in steps:
            step()
            assert pool.snapshot("m", 0.0, mono) == fresh(pool, 0.0, mono)
            pool.lease(a).release()  # two changes between snapshots
            assert pool.snapshot("m", 0.0, mono) == fresh(pool, 0.0, mono)
        a.update(draining=False, pressure=Pressure.NORMAL)
        b.update(draining=False)


def test_routed_state_is_a_value_replaced_whole() -> None:
    _, (a,) = make_pool("v1")
    before = a.routed
    a.update(draining=True)
    assert before.draining is False and a.routed.draining is True
    with pytest.raises(TypeError):
        a.update(drainig=True)  # a misspelt name fails loudly, it cannot go unnoticed
    with pytest.raises(AttributeError):
        a.draining = False  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.routed.in_flight = 3  # type: ignore[misc]
