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


def test_one_tenant_is_envoys_budget_unchanged() -> None:
    budget = RetryBudget(ratio=0.2, minimum=3, backoff_base=0.025, backoff_max=0.25)
    for _ in range(5):
        budget.start("a")
    assert [budget.allow("a") for _ in range(4)] == [True, True, True, False]
    budget.end("a", 3)
    assert budget.retries == 0 and budget.requests == 4


def test_a_tenant_takes_the_last_retries_only_while_nobody_holds_fewer() -> None:
    budget = RetryBudget(ratio=0.2, minimum=3, backoff_base=0.025, backoff_max=0.25)
    for _ in range(10):
        budget.start("flood")
    budget.start("quiet")
    # The flood's poison requests: it holds one more, then the last is the quiet tenant's.
    assert [budget.allow("flood") for _ in range(4)] == [True, True, False, False]
    assert budget.allow("quiet")
    assert not budget.allow("quiet")  # the budget is spent (3 in flight): never past it
    # The quiet tenant's request ends: the flood may take the room again.
    budget.end("quiet", 1)
    assert budget.allow("flood")
    assert budget.retries == 3
    # Equals do not block each other: the first to ask takes the last.
    even = RetryBudget(ratio=0.0, minimum=1, backoff_base=0.0, backoff_max=0.0)
    even.start("a")
    even.start("b")
    assert even.allow("b") and not even.allow("a")
