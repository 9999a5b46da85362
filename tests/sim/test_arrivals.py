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


def _one_shot(rid: str, at: float) -> SimRequest:
    return SimRequest.of(at, rid, ((hash(rid) % 1000 + 10, 10),), 8)


def test_past_the_clients_concurrency_a_request_waits_for_a_slot_first_come_first_served() -> None:
    a, b, c, d = (_one_shot(r, t) for r, t in (("a", 0.0), ("b", 0.1), ("c", 0.2), ("d", 0.3)))
    arrivals = Arrivals(iter([a, b, c, d]), concurrency=2)
    assert arrivals.take() == a
    assert arrivals.take() == b
    assert arrivals.take() is None  # c is due with two out: it waits
    assert arrivals.take() is None  # and d behind it
    assert (arrivals.queued, arrivals.upcoming) == (2, None)
    arrivals.ended("b", 1.0)  # b's slot goes to c, sent at b's end
    sent = arrivals.take()
    assert sent is not None and (sent.request_id, sent.arrival) == ("c", 1.0)
    assert arrivals.upcoming is None  # still two out: a and c
    arrivals.ended("a", 2.0)
    sent = arrivals.take()
    assert sent is not None and (sent.request_id, sent.arrival) == ("d", 2.0)
    arrivals.ended("c", 3.0)
    arrivals.ended("d", 3.0)
    e = _one_shot("e", 4.0)  # nobody out: a later request goes at once
    arrivals = Arrivals(iter([a, e]), concurrency=1)
    assert arrivals.take() == a
    arrivals.ended("a", 3.0)
    assert arrivals.take() == e


def test_a_held_turn_released_by_its_previous_one_still_needs_a_slot() -> None:
    # FIRST and STRANGER take both slots; SECOND, due meanwhile, waits for FIRST's end
    # and then for a slot: FIRST's own, which it gets at once.
    arrivals = Arrivals(iter([FIRST, SECOND, STRANGER]), concurrency=2)
    assert arrivals.take() == FIRST
    assert arrivals.take() is None  # SECOND held for FIRST
    assert arrivals.take() == STRANGER
    arrivals.ended("a1", 3.0)
    second = arrivals.take()
    assert second is not None and (second.request_id, second.arrival) == ("a2", 3.0)
    assert arrivals.queued == 0
    # With one slot, the released turn queues behind the stranger still out.
    arrivals = Arrivals(iter([FIRST, SECOND, STRANGER]), concurrency=1)
    assert arrivals.take() == FIRST
    assert arrivals.take() is None  # SECOND held for FIRST
    assert arrivals.take() is None  # STRANGER waits for a slot
    arrivals.ended("a1", 3.0)  # FIRST's slot goes to STRANGER, first in line
    taken = [arrivals.take(), arrivals.take()]
    assert [r.request_id for r in taken if r is not None] == ["b1"]
    arrivals.ended("b1", 4.0)
    second = arrivals.take()
    assert second is not None and (second.request_id, second.arrival) == ("a2", 4.0)


def test_a_run_never_has_more_out_than_the_clients_concurrency() -> None:
    config = SimConfig(workers=2, kv_blocks=(10_000,), block_size=16, seed=1, max_requests=200,
                       client_concurrency=3)  # fmt: skip
    workload = build_workload("shared-opening-trace:rate=20", seed=1)
    sim = Simulation(config, workload.requests(), "round_robin")
    most = 0
    original = sim.gateway.arrive

    def arrive(request: SimRequest, now: float) -> None:
        nonlocal most
        original(request, now)
        most = max(most, len(sim.gateway.flights) + sim.gateway.queue_depth)

    sim.gateway.arrive = arrive  # type: ignore[method-assign]
    summary = sim.run().summary
    assert summary["finished"] + summary["shed"] == 200
    assert summary["client_queued"] > 0
    assert most <= 3


def test_a_request_a_finish_releases_is_not_held_behind_another_workers_fused_decode() -> None:
    # A decodes 400 tokens alone on w0 (its steps fused while nothing can arrive); B ends
    # soon on w1 and its slot releases C, which round robin sends to w0. C starts at the
    # next step there, not when a fused run of A's steps ends (seconds later).
    a = SimRequest.of(0.0, "a", ((1, 64),), 400)
    b = SimRequest.of(0.0, "b", ((2, 64),), 2)
    c = SimRequest.of(0.0, "c", ((3, 64),), 2)
    config = SimConfig(workers=2, kv_blocks=(1_000,), block_size=16, client_concurrency=2)
    run = Simulation(config, [a, b, c], "round_robin").run()
    assert run.summary["finished"] == 3
    assert run.summary["duration_s"] > 2.0  # A's decode: the fused run C must not wait for
    assert max(run.recorder.ttft) < 0.1
