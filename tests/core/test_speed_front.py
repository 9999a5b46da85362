"""``Book.front``: the queue ``default`` reads of each candidate at every placement, kept
from one change of the book to the next, is the book's own (``FleetSpeed.queue``) in
seconds at the prior's rate, whatever the book went through."""

from __future__ import annotations

import math
import random

import pytest

from kvgate.core.speed import IDLE_BOOK, FleetSpeed, Speed

PRIOR = Speed(0.0, 1.0 / 12_000, 0.002)


def queued_s(speed: FleetSpeed, worker: str, now: float) -> float:
    """What ``DefaultPolicy._place`` reads: the front, settled once past its next start."""
    book = speed.books.get(worker, IDLE_BOOK)
    drains, owes, _ = book.front if book.front[2] > now else book.settled(now)
    queued = drains - now
    return 0.0 if queued <= 0.0 else owes if queued > owes else queued


@pytest.mark.parametrize("seed", range(8))
def test_the_front_is_the_books_queue_through_sends_first_tokens_ends_and_rate_moves(
    seed: int,
) -> None:
    rng = random.Random(seed)
    speed = FleetSpeed(PRIOR, max_pending=24, at_prior=True)
    workers = ["a", "b", "c"]
    flying: list[str] = []
    now = 0.0
    for n in range(400):
        now += rng.expovariate(40.0)
        roll = rng.random()
        if roll < 0.45 or not flying:
            rid = f"r{n}"
            speed.sent(rid, rng.choice(workers), now, rng.uniform(0, 3_000), streamed=True)
            flying.append(rid)
        elif roll < 0.7:
            speed.first_token(rng.choice(flying), now)
        elif roll < 0.9:
            rid = flying.pop(rng.randrange(len(flying)))
            speed.ended(rid, 1_000, rng.randrange(1_000))
        elif roll < 0.95:
            speed.dropped(flying.pop(rng.randrange(len(flying))))
        else:  # an engine reports its own rate: the prior, so every front's rate, moves
            speed.engine(rng.choice(workers), None, rng.uniform(0.5, 2.0) / 12_000)
        for w in workers:
            if rng.random() < 0.5:  # read at a later moment, as a placement would
                at = now + rng.expovariate(20.0)
                rate = speed.prior_of(w).prefill_s
                expected = speed.queue(w, at)[0] * rate
                assert queued_s(speed, w, at) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_no_book_and_a_policy_not_at_the_prior_keep_no_front() -> None:
    speed = FleetSpeed(PRIOR)  # ``ttft``'s: drains at the rate learned, reads ``look``
    speed.sent("r", "a", 0.0, 1_000)
    assert speed.books["a"].front == (-math.inf, 0.0, math.inf)
    assert queued_s(speed, "b", 0.0) == 0.0
    assert IDLE_BOOK.front == (-math.inf, 0.0, math.inf)
