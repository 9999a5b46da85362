"""Table tests both cost-model policies pass: ``default`` and its successor ``ttft``.

Each predicts every candidate's time to first token from what it holds and what is
queued there; these tables hold for both (``test_default_policy``, ``test_ttft_policy``
test what differs).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.core.policies.default import DefaultPolicy
from kvgate.core.policies.ttft import TtftPolicy
from kvgate.core.policy import Policy, RouteContext

from .tables import (
    THREE,
    chain,
    ctx,
    fleet,
    place_concurrently,
    queue,
    request,
    with_loads,
    worker,
)

POLICIES = pytest.mark.parametrize("make", [DefaultPolicy, TtftPolicy], ids=["default", "ttft"])


@POLICIES
def test_new_session_goes_where_its_prefix_is_cached_and_is_bound_there(
    make: Callable[[], Policy],
) -> None:
    policy = make()
    policy.on_routed(request("w", hashes=chain(1, 8)), "c", -10.0)  # done by now
    decision = policy.pick(request(session="s", hashes=chain(1, 8)), ctx(fleet(*with_loads(c=1))))
    assert (decision.worker, decision.reason) == ("c", "prefix_match")
    assert decision.affinity is not None
    assert (decision.affinity.session_key, decision.affinity.expected) == ("s", None)


@POLICIES
def test_the_longest_cached_match_wins(make: Callable[[], Policy]) -> None:
    policy = make()
    policy.on_routed(request("short", hashes=chain(1, 4)), "a", -10.0)
    policy.on_routed(request("long", hashes=chain(1, 40)), "b", -10.0)
    decision = policy.pick(request("q", hashes=(*chain(1, 40), 7)), ctx(fleet(*THREE)))
    assert (decision.worker, decision.reason) == ("b", "prefix_match")


@POLICIES
def test_a_busy_worker_loses_new_work_to_idle_ones(make: Callable[[], Policy]) -> None:
    policy = make()
    queue(policy, "a", 0.5)
    decision = policy.pick(request(hashes=chain(5, 8)), ctx(fleet(*THREE)))
    assert decision.worker in ("b", "c")


@POLICIES
def test_another_replicas_placement_reaches_this_one_through_the_store_holders(
    make: Callable[[], Policy],
) -> None:
    """Replica B never routed the conversation; the store says A sent 40 blocks to b."""
    replica_b = make()
    hashes = (*chain(1, 40), 5, 6)
    context = RouteContext(fleet(*THREE).without(frozenset()), None, ctx(fleet()).rng, {"b": 40})
    decision = replica_b.pick(request("turn2", hashes=hashes), context)
    assert (decision.worker, decision.reason) == ("b", "prefix_match")


@POLICIES
def test_a_trickle_at_zero_load_takes_turns(make: Callable[[], Policy]) -> None:
    """At low load every worker ties at zero: recent routing, not the id, breaks it."""
    policy = make()
    chosen = []
    for n in range(6):
        snapshot = fleet(*THREE, now=float(n))
        hashes = chain(100 + n, 4)
        decision = policy.pick(request(f"r{n}", hashes=hashes), ctx(snapshot))
        assert decision.worker is not None
        policy.on_routed(request(f"r{n}", hashes=hashes), decision.worker, float(n))
        chosen.append(decision.worker)
    assert sorted(chosen) == ["a", "a", "b", "b", "c", "c"]


@POLICIES
def test_no_prompt_goes_least_loaded_unbound(make: Callable[[], Policy]) -> None:
    decision = make().pick(request(), ctx(fleet(*with_loads(a=1, b=0, c=2))))
    assert (decision.worker, decision.reason, decision.affinity) == ("b", "least_loaded", None)


@POLICIES
def test_headerless_requests_sharing_an_opening_spread_instead_of_herding(
    make: Callable[[], Policy],
) -> None:
    """Issue 11's failure: a shared opening made all traffic one "session" on one worker."""
    loads = place_concurrently(make(), 8, 8, [6] * 40)
    assert min(loads.values()) >= 3
    assert max(loads.values()) <= 7


@POLICIES
@settings(max_examples=60, deadline=None)
@given(
    workers=st.integers(2, 8),
    opening=st.integers(1, 32),
    tails=st.lists(st.integers(4, 48), min_size=4, max_size=12),
    rounds=st.integers(2, 4),
)
def test_property_requests_sharing_only_an_opening_are_not_all_on_one_worker(
    make: Callable[[], Policy], workers: int, opening: int, tails: list[int], rounds: int
) -> None:
    """At concurrency (nothing finishes), strangers behind one opening use several workers.

    Each request's own tail is at least an eighth of the opening, and there are at
    least two requests per worker: then no single worker may take all, nor more
    than three quarters of the work (the tails' blocks). Load is what requests cost,
    not how many they are: with tails of 15 and 4 blocks, two long ones on one of two
    workers and eight short ones on the other is balanced (32 blocks against 40).
    """
    tails = [max(t, opening // 8) for t in tails] * max(rounds, -(-2 * workers // len(tails)))
    work: dict[str, int] = {}
    loads = place_concurrently(make(), workers, opening, tails, work=work)
    assert sum(1 for n in loads.values() if n) >= 2
    assert max(work.values()) <= 0.75 * sum(tails)


@POLICIES
@pytest.mark.parametrize("away_on", ["a", "b"])
def test_kv_reserved_for_sessions_away_on_a_tool_call_steers_new_work_off_it(
    make: Callable[[], Policy], away_on: str
) -> None:
    """Both workers hold an earlier conversation's KV and are alike but for the KV of
    sessions away on a tool call (``kv_reserved_tokens``, core.toolcalls): new work goes
    where it evicts nothing that is coming back, whichever worker that is."""
    policy = make()
    policy.on_routed(request("x", hashes=chain(2, 40)), "a", -10.0)
    policy.on_routed(request("y", hashes=chain(3, 40)), "b", -10.0)
    both = [
        worker(w, kv_capacity_tokens=20_000, kv_usage=0.5,
               kv_reserved_tokens=18_000 if w == away_on else 0)
        for w in ("a", "b")
    ]  # fmt: skip
    decision = policy.pick(request("new", hashes=chain(9, 40)), ctx(fleet(*both)))
    assert decision.worker == ("b" if away_on == "a" else "a")
