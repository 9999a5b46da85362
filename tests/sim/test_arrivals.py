"""``sim.arrivals``: a later turn comes once its previous turn ended, as live clients send it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvgate.sim.arrivals import Arrivals
from kvgate.sim.simulation import SimConfig, Simulation
from kvgate.workload.request import Segment, SimRequest
from kvgate.workload.synthetic import build_workload


def _turn(rid: str, at: float, segments: tuple[Segment, ...], reply: Segment | None) -> SimRequest:
    return SimRequest.of(at, rid, segments, 8, reply=reply, conversation="c")


def _drain(arrivals: Arrivals) -> Iterator[SimRequest]:
    while arrivals.upcoming is not None:
        request = arrivals.take()
        if request is not None:
            yield request


# A conversation of three turns, each re-sending the previous reply, and a stranger.
FIRST = _turn("a1", 0.0, ((1, 10),), (2, 8))
SECOND = _turn("a2", 1.0, ((1, 10), (2, 8), (3, 4)), (4, 8))
THIRD = _turn("a3", 2.0, ((1, 10), (2, 8), (3, 4), (4, 8), (5, 4)), None)
STRANGER = SimRequest.of(1.5, "b1", ((9, 10),), 8)


def test_a_turn_due_before_its_previous_one_ended_comes_at_that_end() -> None:
    arrivals = Arrivals(iter([FIRST, SECOND, STRANGER]))
    assert arrivals.take() == FIRST
    assert arrivals.take() is None  # SECOND is due at 1.0; FIRST has not ended
    assert arrivals.waiting == 1
    assert arrivals.upcoming == STRANGER
    assert arrivals.take() == STRANGER
    arrivals.ended("a1", 3.5)
    late = arrivals.take()
    assert late is not None
    assert (late.request_id, late.arrival) == ("a2", 3.5)
    assert (arrivals.held, arrivals.waiting, arrivals.upcoming) == (1, 0, None)


def test_a_turn_whose_previous_one_ended_in_time_comes_at_its_arrival() -> None:
    arrivals = Arrivals(iter([FIRST, SECOND]))
    assert arrivals.take() == FIRST
    arrivals.ended("a1", 0.5)
    assert arrivals.take() == SECOND
    assert arrivals.held == 0


def test_a_refused_turn_releases_the_next_and_a_held_turn_holds_its_own_next() -> None:
    # SECOND waits for FIRST; THIRD re-sends SECOND's reply, so it waits for SECOND
    # even though SECOND has not reached the gateway yet (the live replay's rule).
    arrivals = Arrivals(iter([FIRST, SECOND, THIRD]))
    assert arrivals.take() == FIRST
    assert arrivals.take() is None
    assert arrivals.take() is None
    assert arrivals.waiting == 2
    arrivals.ended("a1", 4.0)  # refused, say: ended all the same
    second = arrivals.take()
    assert second is not None and second.arrival == 4.0
    assert arrivals.upcoming is None
    arrivals.ended("a2", 5.0)
    third = arrivals.take()
    assert third is not None and (third.request_id, third.arrival) == ("a3", 5.0)


def test_open_loop_sends_every_request_at_its_arrival() -> None:
    arrivals = Arrivals(iter([FIRST, SECOND, STRANGER, THIRD]), turns_wait=False)
    assert [r.request_id for r in _drain(arrivals)] == ["a1", "a2", "b1", "a3"]
    assert arrivals.held == 0


@pytest.mark.parametrize("turns_wait", [True, False])
def test_a_run_places_no_turn_before_its_previous_one_finished_unless_open(
    turns_wait: bool,
) -> None:
    config = SimConfig(workers=2, kv_blocks=(400,), block_size=16, seed=1, max_requests=200,
                       turns_wait=turns_wait)  # fmt: skip
    workload = build_workload("headerless-chat:rate=20", seed=1)
    summary = Simulation(config, workload.requests(), "default", misses=True).run().summary
    assert summary["finished"] + summary["shed"] == 200
    early = summary["misses"]["tokens"]["turn_early"]
    if turns_wait:
        assert summary["turns_held"] > 0
        assert early == 0
    else:
        assert summary["turns_held"] == 0
        assert early > 0
