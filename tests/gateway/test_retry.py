"""The retry budget: retries in flight under 20% of requests in flight, at least 3."""

from __future__ import annotations

import random

from kvgate.gateway.dataplane.retry import RetryBudget


def test_minimum_then_ratio() -> None:
    budget = RetryBudget(ratio=0.2, minimum=3, backoff_base=0.025, backoff_max=0.25)
    budget.requests = 5
    assert [budget.allow() for _ in range(4)] == [True, True, True, False]
    budget.requests = 50
    assert sum(budget.allow() for _ in range(20)) == 7  # 10 allowed in all, 3 taken
    budget.give_back(10)
    assert budget.retries == 0


def test_backoff_is_jittered_and_capped() -> None:
    budget = RetryBudget(ratio=0.2, minimum=3, backoff_base=0.025, backoff_max=0.25)
    rng = random.Random(1)
    waits = [budget.backoff(attempt, rng) for attempt in range(1, 10) for _ in range(20)]
    assert all(0 <= w <= 0.25 for w in waits)
    assert max(budget.backoff(1, rng) for _ in range(50)) <= 0.025
