"""Tool-call pauses learned from the fleet, and the KV of sessions away on one."""

from __future__ import annotations

import pytest

from kvgate.core.attempt import AttemptEnd, AttemptState, ToolCalled
from kvgate.core.toolcalls import AwaySessions, ToolPauses, leaves_away


def test_the_horizon_is_the_prior_until_enough_pauses_then_their_quantile() -> None:
    pauses = ToolPauses(quantile=0.9, prior_s=30.0, min_samples=4)
    assert pauses.horizon() == 30.0
    for seconds in (1.0, 2.0, 3.0):
        pauses.observe(seconds)
    assert pauses.horizon() == 30.0
    for seconds in (4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 100.0):
        pauses.observe(seconds)
    assert pauses.horizon() == 100.0  # 0.9 of ten pauses: the tenth
    assert pauses.back_within(5.0) == pytest.approx(0.5)
    pauses.observe(-1.0)  # a clock that went back says nothing
    assert pauses.samples == 10


def test_the_sample_keeps_only_the_most_recent_pauses() -> None:
    pauses = ToolPauses(capacity=3, quantile=1.0, min_samples=1)
    for seconds in (50.0, 1.0, 2.0, 3.0):
        pauses.observe(seconds)
    assert pauses.samples == 3
    assert pauses.horizon() == 3.0  # the 50 s pause aged out


def test_away_sessions_reserve_their_kv_until_the_horizon_then_return_and_teach() -> None:
    book = AwaySessions(ToolPauses(prior_s=10.0, min_samples=1, quantile=1.0))
    book.left("a", "w1", 1000, now=0.0)
    book.left("b", "w1", 500, now=2.0)
    book.left("c", "w2", 700, now=2.0)
    assert book.reserved(now=5.0) == {"w1": 1500, "w2": 700}
    assert book.reserved(now=11.0) == {"w1": 500, "w2": 700}  # a: past the prior horizon
    back = book.returned("b", now=6.0)
    assert back is not None and (back.worker, back.kv_tokens) == ("w1", 500)
    assert book.pauses.horizon() == 4.0  # b's pause, the one seen
    assert book.returned("b", now=7.0) is None
    assert book.reserved(now=5.5) == {"w2": 700}  # a is 5.5 s away, past 4 s; c 3.5 s


def test_a_session_leaving_again_is_booked_once_and_the_book_is_bounded() -> None:
    book = AwaySessions(max_sessions=2)
    book.left("a", "w1", 10, now=0.0)
    book.left("a", "w2", 20, now=1.0)
    assert len(book) == 1 and book.reserved(1.0) == {"w2": 20}
    book.left("b", "w1", 1, now=1.0)
    book.left("c", "w1", 1, now=1.0)
    assert len(book) == 2 and book.get("a") is None  # the oldest forgotten


def test_away_sessions_are_offloaded_once_under_pressure_and_stop_reserving() -> None:
    book = AwaySessions()
    book.left("a", "w1", 100, now=0.0)
    book.left("b", "w2", 100, now=0.0)
    assert book.offload_due("w1", 0.5, threshold=0.85) == []
    assert book.offload_due("w1", None, threshold=0.85) == []
    assert book.offload_due("w1", 0.9, threshold=0.85) == ["a"]
    assert book.offload_due("w1", 0.95, threshold=0.85) == []  # asked once
    assert book.reserved(now=1.0) == {"w2": 100}  # a's KV is off the GPU


def test_sessions_away_far_past_the_horizon_are_forgotten() -> None:
    book = AwaySessions(ToolPauses(prior_s=10.0))
    book.left("a", "w1", 1, now=0.0)
    book.left("b", "w1", 1, now=35.0)
    book.expire(now=41.0)
    assert book.get("a") is None and book.get("b") is not None


def _ended(how: str, *, called: bool = True, usage: bool = True) -> AttemptEnd:
    """An attempt's end: ``how`` it ended, its answer calling a tool, its usage read."""
    state = AttemptState("w1", "v1", 0.0)
    state.token(0.1)
    if usage:
        state.usage(1000, 600, 40)
    if called:
        state.step(ToolCalled(0.2))
    end = {
        "completed": lambda: state.completed(0.3),
        "failed": lambda: state.failed(0.3, "broken"),
        "cancelled": lambda: state.cancelled(0.3),
    }[how]()
    assert end is not None and end.tool_call is called
    return end


def test_a_session_is_away_after_an_attempt_whose_client_got_its_tool_call() -> None:
    assert leaves_away(_ended("completed")) == 1040  # its prompt's and answer's KV
    assert leaves_away(_ended("completed", usage=False)) == 0
    # The client went at the end of the stream, its usage read: it has the call.
    assert leaves_away(_ended("cancelled")) == 1040
    # Went before the end, or the worker broke it off: the turn is sent again, not away.
    assert leaves_away(_ended("cancelled", usage=False)) is None
    assert leaves_away(_ended("failed")) is None
    assert leaves_away(_ended("completed", called=False)) is None


def test_a_tool_call_reported_after_the_end_changes_nothing() -> None:
    state = AttemptState("w1", "v1", 0.0)
    end = state.completed(1.0)
    state.tool_call(2.0)
    assert end is not None and not end.tool_call and state.end is end
