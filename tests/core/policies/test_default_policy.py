"""Table tests of the default policy: stickiness, prefix placement, hash fallback."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvgate.core.fleet import Health, Pressure
from kvgate.core.hashing import rendezvous_order
from kvgate.core.policies.default import DefaultConfig, DefaultPolicy

from .tables import chain, ctx, fleet, request, worker

THREE = (worker("a"), worker("b"), worker("c"))


def with_loads(**loads: int) -> tuple:
    return tuple(replace(w, in_flight=loads.get(w.id, 0)) for w in THREE)


@pytest.mark.parametrize(
    ("workers", "bound_to", "chosen", "reason"),
    [
        (with_loads(a=2, b=0, c=0), "a", "a", "affinity_hit"),
        # Soft pressure keeps an affine session.
        ((replace(THREE[0], pressure=Pressure.SOFT), *THREE[1:]), "a", "a", "affinity_hit"),
        # Past the sticky cap ceil(2.0 * 15 / 3) + 4 = 14.
        (with_loads(a=14, b=0, c=0), "a", None, "affinity_overloaded_migrated"),
        (
            (replace(THREE[0], health=Health.DRAINING), *THREE[1:]),
            "a",
            None,
            "affinity_lost_migrated",
        ),
        (
            (replace(THREE[0], pressure=Pressure.HARD), *THREE[1:]),
            "a",
            None,
            "affinity_pressure_migrated",
        ),
    ],
)
def test_known_sessions(workers: tuple, bound_to: str, chosen: str | None, reason: str) -> None:
    decision = DefaultPolicy().pick(
        request(session="s", hashes=chain(1, 4)), ctx(fleet(*workers), bound_to)
    )
    assert decision.reason == reason
    if chosen is not None:
        assert decision.worker == chosen
        assert decision.affinity is None
    else:
        assert decision.worker not in (None, "a")
        assert decision.affinity is not None
        assert decision.affinity.expected == "a"
        assert decision.affinity.worker == decision.worker


def test_new_session_goes_where_its_prefix_is_cached() -> None:
    policy = DefaultPolicy()
    policy.on_routed(request("w", hashes=chain(1, 8)), "c", 0.0)
    decision = policy.pick(request(session="s", hashes=chain(1, 8)), ctx(fleet(*with_loads(c=2))))
    assert (decision.worker, decision.reason) == ("c", "prefix_match")
    assert decision.affinity is not None
    assert (decision.affinity.session_key, decision.affinity.expected) == ("s", None)


def test_new_session_without_a_cached_prefix_takes_the_hash_choice() -> None:
    hashes = chain(9, 8)
    expected = rendezvous_order(hashes[3], THREE)[0].id
    replica_one, replica_two = DefaultPolicy(), DefaultPolicy()
    one = replica_one.pick(request(session="s", hashes=hashes), ctx(fleet(*THREE)))
    two = replica_two.pick(request(session="t", hashes=hashes), ctx(fleet(*THREE)))
    assert one.worker == two.worker == expected
    assert one.reason == "hash_primary"


def test_prefix_derived_key_is_bound_so_later_turns_stick() -> None:
    decision = DefaultPolicy().pick(
        request(prefix_key="prefix:ab", hashes=chain(2, 3)), ctx(fleet(*THREE))
    )
    assert decision.affinity is not None
    assert decision.affinity.session_key == "prefix:ab"
    off = DefaultPolicy(DefaultConfig(use_prefix_key=False))
    assert (
        off.pick(request(prefix_key="prefix:ab", hashes=chain(2, 3)), ctx(fleet(*THREE))).affinity
        is None
    )


def test_overloaded_warm_worker_falls_through_to_the_bounded_hash() -> None:
    policy = DefaultPolicy()
    policy.on_routed(request("w", hashes=chain(1, 8)), "a", 0.0)
    decision = policy.pick(request(hashes=chain(1, 8)), ctx(fleet(*with_loads(a=20, b=1, c=1))))
    assert decision.worker in ("b", "c")
    assert decision.reason.startswith("hash_")


def test_migration_with_nowhere_under_threshold_refuses() -> None:
    config = DefaultConfig(threshold_kind="in_flight", threshold=3)
    workers = with_loads(a=3, b=3, c=5)
    decision = DefaultPolicy(config).pick(request(session="s"), ctx(fleet(*workers), "a"))
    assert (decision.shed, decision.reason) == (True, "capacity_full")


def test_no_key_no_prompt_goes_least_loaded_unbound() -> None:
    decision = DefaultPolicy().pick(request(), ctx(fleet(*with_loads(a=1, b=0, c=2))))
    assert (decision.worker, decision.reason, decision.affinity) == ("b", "least_loaded", None)
