"""The fill a placement is charged follows what the worker was sent lately (``core.speed``'s
book: ``FleetSpeed.lately``; ``Warming._charge``).

A worker's share of the prefix index forgets only as new blocks push old ones out, so a
worker sent nothing keeps its fill for good; charged that fill, a worker the policy
stopped sending to (a slowed one, learned slow) kept paying for evicting a cache nobody
had asked for in minutes, and stayed starved (``core.policies.default``).
"""

from __future__ import annotations

import pytest

from kvgate.core.policies.default import DefaultPolicy

HALF_S = 60.0  # ``recent_half_life_s``


def sent(*at: float) -> DefaultPolicy:
    """A policy whose worker ``a`` was sent a request of 1,000 uncached tokens at each ``at``."""
    policy = DefaultPolicy()
    for i, t in enumerate(at):
        policy.speed.sent(f"r{i}", "a", t, 1000.0)
    return policy


def refill(policy: DefaultPolicy, fill: float, now: float) -> None:
    """The index says ``a``'s share is ``fill`` of a 2,000-token cache."""
    policy._fills["a"] = (fill, 2000.0)
    policy._charge("a", now)


def test_a_worker_sent_nothing_lately_is_charged_less_and_less_of_its_fill() -> None:
    policy = sent(0.0)
    refill(policy, 0.5, 0.0)  # 1,000 of a 2,000-token cache
    assert policy.charged["a"][0] == pytest.approx(0.5)
    assert policy.speed.lately("a", HALF_S) == (pytest.approx(0.5), pytest.approx(500.0))
    policy._age(HALF_S)
    assert policy.charged["a"][0] == pytest.approx(0.25)
    policy._age(2 * HALF_S)
    assert policy.charged["a"][0] == pytest.approx(0.125)


def test_a_busy_worker_is_charged_its_whole_fill() -> None:
    policy = sent(*map(float, range(10)))  # 10,000 tokens into a 2,000-token cache over 10 s
    refill(policy, 1.0, 9.0)
    policy._age(HALF_S)
    assert policy.charged["a"][0] == pytest.approx(1.0)
    # What the index holds bounds it: sent lately but already reported evicted.
    refill(policy, 0.3, HALF_S)
    assert policy.charged["a"][0] == pytest.approx(0.3)


def test_fills_are_charged_again_only_every_sixteenth_of_the_half_life() -> None:
    policy = sent(0.0)
    refill(policy, 0.5, 0.0)
    policy._age(HALF_S / 32)  # the first call charges them; too soon after: unchanged
    charged = policy.charged["a"][0]
    policy._age(HALF_S / 32 + HALF_S / 20)
    assert policy.charged["a"][0] == charged
