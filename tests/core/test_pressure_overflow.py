"""Where work goes that shedding lets through when every worker is pressured."""

from __future__ import annotations

import pytest

from kvgate.core.decision import Affinity
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import FleetSnapshot, Health, Pressure, WorkerState
from kvgate.core.pressure import overflow_decision, overflow_fleet, overflow_target

N, S, H = Pressure.NORMAL, Pressure.SOFT, Pressure.HARD


def fleet(*workers: tuple[str, Pressure, int]) -> FleetSnapshot:
    return FleetSnapshot(
        0.0,
        tuple(WorkerState(id=i, model="m", pressure=p, in_flight=load) for i, p, load in workers),
    )


@pytest.mark.parametrize(
    ("workers", "affine", "expected"),
    [
        # A NORMAL worker exists: policies handle it, no overflow.
        ((("a", N, 0), ("b", S, 0)), None, None),
        # All SOFT: least loaded.
        ((("a", S, 3), ("b", S, 1)), None, "b"),
        # SOFT before HARD, whatever the load.
        ((("a", H, 0), ("b", S, 9)), None, "b"),
        # Affine work stays on its own SOFT worker.
        ((("a", S, 0), ("b", S, 9)), "b", "b"),
        # Its own worker is HARD but another is SOFT: go there.
        ((("a", S, 5), ("b", H, 0)), "b", "a"),
        # Everyone HARD: stay where the cache is.
        ((("a", H, 0), ("b", H, 9)), "b", "b"),
    ],
)
def test_overflow_target(
    workers: tuple[tuple[str, Pressure, int], ...], affine: str | None, expected: str | None
) -> None:
    chosen = overflow_target(fleet(*workers), affine)
    assert (chosen.id if chosen is not None else None) == expected


def test_no_overflow_onto_a_full_or_unroutable_worker() -> None:
    snap = FleetSnapshot(
        0.0,
        (
            WorkerState(id="a", model="m", pressure=S, in_flight=4, max_in_flight=4),
            WorkerState(id="b", model="m", pressure=S, health=Health.EJECTED),
        ),
    )
    assert overflow_target(snap) is None


def test_overflow_decision_binds_a_moved_session_with_compare_and_set() -> None:
    request = RequestFeatures(request_id="r", model="m", session_key="s1")
    snap = fleet(("a", S, 0), ("b", H, 0))
    decision = overflow_decision(request, Affinity("s1", "b", "default"), snap)
    assert decision is not None
    assert (decision.worker, decision.reason) == ("a", "pressure_overflow")
    assert decision.affinity is not None
    assert (decision.affinity.worker, decision.affinity.expected) == ("a", "b")
    stays = overflow_decision(request, Affinity("s1", "a", "default"), snap)
    assert stays is not None and stays.worker == "a" and stays.affinity is None


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        # A NORMAL worker exists: no overflow.
        ((("a", N, 0), ("b", S, 0)), None),
        # All SOFT: every open worker, shown NORMAL for the policy to weigh.
        ((("a", S, 3), ("b", S, 1)), ("a", "b")),
        # SOFT ones only while some are not HARD.
        ((("a", H, 0), ("b", S, 9), ("c", S, 2)), ("b", "c")),
        # All HARD: all of them.
        ((("a", H, 0), ("b", H, 9)), ("a", "b")),
    ],
)
def test_overflow_fleet_is_what_an_overflow_may_use(
    workers: tuple[tuple[str, Pressure, int], ...], expected: tuple[str, ...] | None
) -> None:
    view = overflow_fleet(fleet(*workers))
    if expected is None:
        assert view is None
        return
    assert view is not None
    assert tuple(w.id for w in view.workers) == expected
    assert {w.pressure for w in view.workers} == {N}
    loads = {i: load for i, _, load in workers}
    assert all(w.in_flight == loads[w.id] for w in view.workers)  # nothing else changes


def test_overflow_fleet_leaves_out_full_and_unroutable_workers() -> None:
    snap = FleetSnapshot(
        0.0,
        (
            WorkerState(id="a", model="m", pressure=S, in_flight=4, max_in_flight=4),
            WorkerState(id="b", model="m", pressure=S, health=Health.EJECTED),
            WorkerState(id="c", model="m", pressure=H),
        ),
    )
    view = overflow_fleet(snap)
    assert view is not None and tuple(w.id for w in view.workers) == ("c",)
    assert overflow_fleet(FleetSnapshot(0.0, snap.workers[:2])) is None
