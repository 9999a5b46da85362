"""The attempt's state machine: every path ends it exactly once, judged by how it ended.

Each row is a sequence of events (what a data plane reports, in order) and what
its one end must say: how it ended, the passive-health judgement, the status and
whether the policy hears usage. Every row is also replayed with the end events
repeated and shuffled after the first end, which must change nothing.
"""

from __future__ import annotations

import itertools
import random
from typing import NamedTuple

import pytest

from kvgate.core.attempt import (
    DEADLINE,
    Ahead,
    Answered,
    AttemptEnd,
    AttemptState,
    Cancelled,
    Completed,
    EndKind,
    Event,
    Failed,
    Judgement,
    Routed,
    Sent,
    Token,
    Usage,
    judge,
    tell_policy,
)
from kvgate.core.features import RequestFeatures
from kvgate.core.policy import PolicyBase
from kvgate.types import WorkerId

OK, FAULT, UNSETTLED, NONE = Judgement.OK, Judgement.FAULT, Judgement.UNSETTLED, Judgement.NONE
DONE, FAILED, GONE = EndKind.COMPLETED, EndKind.FAILED, EndKind.CANCELLED

START = (Routed(0.0), Sent(0.1))
STREAM = (*START, Answered(0.2, 200), Token(0.3), Token(0.4), Token(0.9))


class Row(NamedTuple):
    name: str
    events: tuple[Event, ...]
    kind: EndKind
    judgement: Judgement
    status: int
    usage: bool
    """The usage reached the policy."""


ANSWER = (*START, Answered(0.2, 200), Token(0.5))

ROWS = [
    Row("answered whole", (*ANSWER, Usage(10, 4, 2), Completed(0.5)), DONE, OK, 200, True),
    Row("stream to its end", (*STREAM, Usage(10, 4, 3), Completed(1.0)), DONE, OK, 200, True),
    Row("a 4xx relayed", (*START, Answered(0.2, 400), Completed(0.2)), DONE, OK, 400, False),
    Row("a 5xx relayed", (*START, Answered(0.2, 503), Completed(0.3)), DONE, FAULT, 503, False),
    Row("unreachable", (Routed(0.0), Failed(0.1, "unavailable")), FAILED, FAULT, 0, False),
    Row("timed out before the head", (*START, Failed(2.0, "timeout")), FAILED, FAULT, 0, False),
    Row(
        "a 5xx the request takes elsewhere",
        (*START, Answered(0.2, 500), Failed(0.2, "status", 500)),
        FAILED,
        UNSETTLED,
        500,
        False,
    ),
    Row(
        "overloaded 429",
        (*START, Answered(0.2, 429), Failed(0.2, "status", 429)),
        FAILED,
        NONE,
        429,
        False,
    ),
    Row("stream cut after 200", (*STREAM, Failed(1.0, "broken")), FAILED, FAULT, 200, False),
    Row("stream stalls too long", (*STREAM, Failed(5.0, "timeout")), FAILED, FAULT, 200, False),
    Row("body not JSON", (*ANSWER, Failed(0.5, "broken")), FAILED, FAULT, 200, False),
    Row("client gone before the head", (*START, Cancelled(0.5)), GONE, NONE, 0, False),
    Row("client gone mid-stream", (*STREAM, Cancelled(1.0)), GONE, NONE, 200, False),
    Row(
        "client gone after the usage",
        (*STREAM, Usage(10, 0, 3), Cancelled(1.0)),
        GONE,
        NONE,
        200,
        True,
    ),
    Row("cancelled before it was routed", (Cancelled(0.0),), GONE, NONE, 0, False),
]

END_EVENTS: tuple[Event, ...] = (Completed(9.0), Failed(9.0, "broken"), Cancelled(9.0))


class Recorder(PolicyBase):
    """A policy that keeps what it was told at an attempt's end."""

    def __init__(self) -> None:
        self.told: list[tuple[str, WorkerId, tuple[int, ...]]] = []

    def on_usage(
        self,
        request: RequestFeatures,
        worker: WorkerId,
        prompt_tokens: int,
        cached_tokens: int,
        now: float,
        *,
        completion_tokens: int = 0,
    ) -> None:
        self.told.append(("usage", worker, (prompt_tokens, cached_tokens, completion_tokens)))

    def on_dropped(self, request: RequestFeatures, worker: WorkerId, now: float) -> None:
        self.told.append(("dropped", worker, ()))


def run(events: tuple[Event, ...]) -> list[AttemptEnd]:
    state = AttemptState(WorkerId("w1"), "v1", 0.0, ahead_requests=3, ahead_kv_tokens=900)
    return [end for e in events if (end := state.step(e)) is not None]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_path_ends_once_judged_by_how_it_ended(row: Row) -> None:
    name, events, kind, judgement, status, usage = row
    ends = run(events)
    assert len(ends) == 1, name
    end = ends[0]
    assert (end.kind, end.judgement, end.status) == (kind, judgement, status), name
    assert (end.prompt_tokens is not None) == usage
    policy = Recorder()
    tell_policy(policy, RequestFeatures(request_id="r", model="m"), end, 1.0)
    if not end.routed:
        assert policy.told == []  # it never heard of the placement: nothing is owed
    else:
        assert [t[0] for t in policy.told] == ["usage" if usage else "dropped"]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_events_after_the_end_change_nothing(row: Row) -> None:
    name, events = row.name, row.events
    rng = random.Random(name)
    first = run(events)[0]
    for _ in range(5):
        late = [*END_EVENTS, Token(9.5), Usage(1, 1, 1), Answered(9.6, 500)]
        rng.shuffle(late)
        ends = run((*events, *late))
        assert ends == [first], name


def test_the_end_carries_what_a_speed_estimator_learns_from() -> None:
    (end,) = run((*STREAM, Usage(100, 60, 3), Completed(1.0)))
    assert end.ahead_requests == 3 and end.ahead_kv_tokens == 900  # as placed: never told
    assert end.ahead_waiting is None
    sent = (Routed(0.0), Sent(0.1, Ahead(5, 1200, 2)), Sent(0.2, Ahead(9, 9, 9)))
    (end,) = run((*sent, Completed(0.5)))
    assert (end.ahead_requests, end.ahead_kv_tokens, end.ahead_waiting) == (5, 1200, 2)
    assert end.sent_at == 0.1  # the first send counts
    (end,) = run((*STREAM, Usage(100, 60, 3), Completed(1.0)))
    assert end.ttft_s == pytest.approx(0.2)  # first token 0.3, sent 0.1
    assert end.decode_s == pytest.approx(0.6)
    assert end.inter_token_s == pytest.approx(0.3)  # 3 tokens: two gaps over 0.6 s
    assert end.max_gap_s == pytest.approx(0.5)  # 0.4 -> 0.9
    assert end.chunks == 3
    assert (end.prompt_tokens, end.cached_tokens, end.completion_tokens) == (100, 60, 3)


def test_judgement_table_is_total() -> None:
    """Every (kind, status, failure) combination gets a judgement, and only a 5xx
    answer that the request takes elsewhere is left for the driver to settle."""
    statuses = (0, 200, 400, 429, 500, 503)
    failures = (None, "status", "unavailable", "timeout", "broken", DEADLINE)
    for kind, status, failure in itertools.product(EndKind, statuses, failures):
        got = judge(kind, status, failure)
        if got is UNSETTLED:
            assert (kind, failure) == (FAILED, "status") and status >= 500
        if kind is FAILED and failure == DEADLINE:
            assert got is Judgement.NONE  # the answer's length is the client's
        if kind is FAILED and failure in ("timeout", "broken") and status != 429:
            assert got is Judgement.FAULT  # the worker's silence


def test_a_move_carries_the_end_to_the_new_worker_and_none_after_the_end() -> None:
    state = AttemptState(WorkerId("w1"), "v1", 0.0)
    state.moved(WorkerId("w2"), "v2")
    state.routed(0.1)
    state.moved(WorkerId("w3"), "v3")  # a native proxy's fallback served it
    end = state.completed(1.0)
    assert end is not None and (end.worker, end.version) == ("w3", "v3")
    with pytest.raises(RuntimeError):
        state.moved(WorkerId("w4"), "v4")
