"""Table tests of the stateless policies: round_robin, random, least_request, power_of_two."""

from __future__ import annotations

from collections import Counter

import pytest

from kvgate.core.fleet import Health, Pressure, WorkerState
from kvgate.core.policies.base import cheapest
from kvgate.core.policies.least_request import LeastRequest
from kvgate.core.policies.power_of_two import PowerOfTwo
from kvgate.core.policies.random_choice import RandomChoice
from kvgate.core.policies.round_robin import RoundRobin

from .tables import ctx, fleet, request, worker


def test_round_robin_cycles_over_candidates_only() -> None:
    policy = RoundRobin()
    snapshot = fleet(
        worker("a"),
        worker("b", health=Health.EJECTED),
        worker("c"),
        worker("d", in_flight=256),
    )
    picks = [policy.pick(request(), ctx(snapshot)) for _ in range(4)]
    assert [d.worker for d in picks] == ["a", "c", "a", "c"]
    assert {d.reason for d in picks} == {"round_robin"}
    assert all(d.affinity is None for d in picks)


@pytest.mark.parametrize(
    ("workers", "winner"),
    [
        ((worker("a", in_flight=3), worker("b", in_flight=1), worker("c", in_flight=2)), "b"),
        ((worker("a", in_flight=1, waiting=5), worker("b", in_flight=3)), "b"),
        ((worker("a", in_flight=2, kv_usage=0.7), worker("b", in_flight=2, kv_usage=0.2)), "b"),
        ((worker("b", in_flight=2), worker("a", in_flight=2)), "a"),
        ((worker("a", in_flight=0, health=Health.DRAINING), worker("b", in_flight=9)), "b"),
        ((worker("a", in_flight=0, pressure=Pressure.SOFT), worker("b", in_flight=9)), "b"),
        ((worker("a", in_flight=0, health=Health.DEGRADED), worker("b", in_flight=9)), "a"),
    ],
)
def test_least_request_table(workers: tuple, winner: str) -> None:
    decision = LeastRequest().pick(request(), ctx(fleet(*workers)))
    assert (decision.worker, decision.reason) == (winner, "least_loaded")


def test_random_uses_the_context_rng_and_reaches_every_candidate() -> None:
    snapshot = fleet(worker("a"), worker("b"), worker("c", health=Health.EJECTED))
    policy = RandomChoice()
    first = [policy.pick(request(), ctx(snapshot, seed=s)).worker for s in range(50)]
    again = [policy.pick(request(), ctx(snapshot, seed=s)).worker for s in range(50)]
    assert first == again
    assert set(first) == {"a", "b"}


def test_power_of_two_prefers_the_less_loaded_of_its_pair() -> None:
    snapshot = fleet(worker("a", in_flight=5), worker("b", in_flight=1))
    policy = PowerOfTwo()
    assert {policy.pick(request(), ctx(snapshot, seed=s)).worker for s in range(20)} == {"b"}


def test_power_of_two_spreads_and_avoids_the_most_loaded() -> None:
    loads = [0, 1, 2, 3, 50]
    snapshot = fleet(*(worker(f"w{i}", in_flight=n) for i, n in enumerate(loads)))
    counts = Counter(PowerOfTwo().pick(request(), ctx(snapshot, seed=s)).worker for s in range(300))
    assert "w4" not in counts
    assert counts["w0"] > counts["w3"]
    assert len(counts) >= 3


@pytest.mark.parametrize(
    ("costs", "expected", "ties"),
    [
        ([3.0, 1.0, 2.0], "b", 0),  # no equal costs: no tie key computed
        ([1.0, 2.0, 1.0], "c", 2),  # c's tie key is lower than a's
        ([2.0, 2.0, 1.0], "c", 2),  # one pass: a tie met on the way is ordered, then beaten
    ],
)
def test_the_cheapest_orders_only_exact_ties(costs: list[float], expected: str, ties: int) -> None:
    workers = [worker(i) for i in "abc"]
    keys = {"a": 2, "b": 0, "c": 1}
    asked: list[str] = []

    def tie(w: WorkerState) -> int:
        asked.append(w.id)
        return keys[w.id]

    assert cheapest(list(zip(costs, workers, strict=True)), tie).id == expected
    assert len(asked) == ties
