"""``Queues``: the fill a placement is charged follows what the worker was sent lately.

A worker's share of the prefix index forgets only as new blocks push old ones out, so a
worker sent nothing keeps its fill for good; charged that fill, a worker the policy
stopped sending to (a slowed one, learned slow) kept paying for evicting a cache nobody
had asked for in minutes, and stayed starved (``core.policies.default``).
"""

from __future__ import annotations

import pytest

from kvgate.core.policies.books import Queues
from kvgate.core.speed import FleetSpeed, Speed

HALF_S = 60.0


def books() -> Queues:
    return Queues(FleetSpeed(Speed(0.0, 1 / 12_000, 0.002)), HALF_S, 600.0, 1024)


def test_a_worker_sent_nothing_lately_is_charged_less_and_less_of_its_fill() -> None:
    queues = books()
    queues.routed("r", "a", 1000.0, (1,), 0.0)
    queues.refill("a", 0.5, 2000.0, 0.0)  # 1,000 of a 2,000-token cache
    assert queues.costs["a"][3] == pytest.approx(0.5)
    queues.age(HALF_S)
    assert queues.costs["a"][3] == pytest.approx(0.25)
    queues.age(2 * HALF_S)
    assert queues.costs["a"][3] == pytest.approx(0.125)


def test_a_busy_worker_is_charged_its_whole_fill() -> None:
    queues = books()
    for i in range(10):  # 10,000 tokens into a 2,000-token cache over 10 s
        queues.routed(f"r{i}", "a", 1000.0, (i,), float(i))
        queues.refill("a", 1.0, 2000.0, float(i))
    queues.age(HALF_S)
    assert queues.costs["a"][3] == pytest.approx(1.0)
    # What the index holds bounds it: sent lately but already reported evicted.
    queues.refill("a", 0.3, 2000.0, HALF_S)
    assert queues.costs["a"][3] == pytest.approx(0.3)


def test_books_are_charged_again_only_every_sixteenth_of_the_half_life() -> None:
    queues = books()
    queues.routed("r", "a", 1000.0, (1,), 0.0)
    queues.refill("a", 0.5, 2000.0, 0.0)
    queues.age(HALF_S / 32)  # the first call charges them; too soon after: unchanged
    charged = queues.costs["a"][3]
    queues.age(HALF_S / 32 + HALF_S / 20)
    assert queues.costs["a"][3] == charged
