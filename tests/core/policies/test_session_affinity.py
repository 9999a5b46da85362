"""Table tests of session_affinity: stay, migrate with a rewritten binding, or refuse."""

from __future__ import annotations

import pytest

from kvgate.core.fleet import Health, Pressure
from kvgate.core.policies.session_affinity import SessionAffinity, SessionAffinityConfig

from .tables import ctx, fleet, request, worker

IN_FLIGHT_4 = SessionAffinityConfig(threshold_kind="in_flight", threshold=4)


MIGRATE = "affinity_overloaded_migrated"

CASES = [
    # (workers, bound_to, config, (chosen, reason, expected worker of the write))
    # Stay while under the threshold, even when others are idler.
    ((worker("a", in_flight=3), worker("b")), "a", IN_FLIGHT_4, ("a", "affinity_hit", None)),
    # At the threshold: move to the least loaded worker under it.
    (
        (worker("a", in_flight=4), worker("b", in_flight=2), worker("c", in_flight=1)),
        "a",
        IN_FLIGHT_4,
        ("c", MIGRATE, "a"),
    ),
    # Fraction of max_in_flight.
    (
        (worker("a", in_flight=8, max_in_flight=10), worker("b")),
        "a",
        SessionAffinityConfig(threshold_kind="fraction", threshold=0.8),
        ("b", MIGRATE, "a"),
    ),
    (
        (worker("a", health=Health.EJECTED), worker("b")),
        "a",
        IN_FLIGHT_4,
        ("b", "affinity_lost_migrated", "a"),
    ),
    ((worker("b"),), "gone", IN_FLIGHT_4, ("b", "affinity_lost_migrated", "gone")),
    # Soft pressure: an affine session may stay; hard pressure moves it.
    (
        (worker("a", pressure=Pressure.SOFT), worker("b")),
        "a",
        IN_FLIGHT_4,
        ("a", "affinity_hit", None),
    ),
    (
        (worker("a", pressure=Pressure.HARD), worker("b")),
        "a",
        IN_FLIGHT_4,
        ("b", "affinity_pressure_migrated", "a"),
    ),
    # New session: least loaded, bound with no expected worker.
    (
        (worker("a", in_flight=2), worker("b", in_flight=1)),
        None,
        IN_FLIGHT_4,
        ("b", "new_session_least_loaded", None),
    ),
]


@pytest.mark.parametrize(("workers", "bound_to", "config", "outcome"), CASES)
def test_session_affinity_table(
    workers: tuple,
    bound_to: str | None,
    config: SessionAffinityConfig,
    outcome: tuple[str, str, str | None],
) -> None:
    chosen, reason, expected = outcome
    decision = SessionAffinity(config).pick(request(session="s"), ctx(fleet(*workers), bound_to))
    assert (decision.worker, decision.reason) == (chosen, reason)
    if reason == "affinity_hit":
        assert decision.affinity is None
    else:
        assert decision.affinity is not None
        assert (decision.affinity.session_key, decision.affinity.worker) == ("s", chosen)
        assert decision.affinity.expected == expected


def test_no_worker_under_threshold_refuses_capacity_full() -> None:
    snapshot = fleet(worker("a", in_flight=4), worker("b", in_flight=5))
    decision = SessionAffinity(IN_FLIGHT_4).pick(request(session="s"), ctx(snapshot, "a"))
    assert decision.shed
    assert decision.reason == "capacity_full"
    assert decision.retry_after is not None and decision.retry_after > 0


def test_migration_never_lands_on_a_pressured_worker() -> None:
    snapshot = fleet(
        worker("a", in_flight=4),
        worker("b", pressure=Pressure.SOFT),
        worker("c", in_flight=3),
    )
    decision = SessionAffinity(IN_FLIGHT_4).pick(request(session="s"), ctx(snapshot, "a"))
    assert decision.worker == "c"


def test_requests_without_any_key_are_routed_least_loaded_and_unbound() -> None:
    snapshot = fleet(worker("a", in_flight=1), worker("b"))
    decision = SessionAffinity().pick(request(), ctx(snapshot))
    assert (decision.worker, decision.reason, decision.affinity) == ("b", "least_loaded", None)
