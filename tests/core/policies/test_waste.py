"""Tables for the waste term: prefill done twice on a backlogged fleet delays those behind it.

With the defaults (12,000 prefill tokens/s, 4 characters a token) one 256-character
block is 5.33 ms of prefill; 32 blocks (a 2,048-token system prompt) are 171 ms.
"""

from __future__ import annotations

import pytest

from kvgate.core.policies.default import DefaultConfig, DefaultPolicy
from kvgate.core.policies.waste import Pace, Waste, rescore

from .tables import chain, ctx, fleet, request, worker

THREE = (worker("a"), worker("b"), worker("c"))
CHARS_PER_S = 12_000 * 4


def test_the_pace_is_the_mean_gap_of_recent_arrivals_and_a_quiet_spell_lowers_it() -> None:
    pace = Pace(span=4)
    assert pace.rate(0.0) == 0.0  # nothing to measure yet
    for n in range(20):
        pace.note(n * 0.01)
    assert pace.rate(0.19) == pytest.approx(100.0)
    assert pace.rate(1.19) == pytest.approx(1.0)  # a second without arrivals


@pytest.mark.parametrize(
    ("queues", "fill", "turns", "expected"),
    [
        ({"a": 0.3, "b": 0.1, "c": 0.0}, 0.0, 1.0, 0.0),  # an idle worker: capacity is free
        ({"a": 0.3, "b": 0.1, "c": 0.1}, 0.0, 1.0, 2.0 / 1.1),  # capped, faded by a's queue
        ({"a": 0.3, "b": 0.1, "c": 0.1}, 0.0, 4.0, 0.5 / 1.1),  # a move carries later turns
        ({"a": 0.3, "b": 0.1, "c": 0.1}, 0.5, 1.0, 1.0 / 1.1),  # the holder's cache half full
        ({"a": 3.0, "b": 0.1, "c": 0.1}, 0.0, 1.0, 1.0),  # its queue at busy_half_s
    ],
)
def test_the_waste_factor(
    queues: dict[str, float], fill: float, turns: float, expected: float
) -> None:
    waste = Waste(cap=2.0, half_s=3.0)
    for _ in range(3):
        waste.pace.note(0.0)  # a burst: every request at once
    waste.turns.add(0.0, 60.0, turns, 1.0)
    table = {w: (q, q, fill if w == "a" else 0.0) for w, q in queues.items()}
    backlog = min(queues.get(w.id, 0.0) for w in THREE)
    factor = waste.factor(0.0, backlog, len(THREE)) * waste.fade(0.0, table["a"])
    assert factor == pytest.approx(expected)


def test_a_slow_trickle_charges_little() -> None:
    waste = Waste(cap=2.0, half_s=3.0)
    for n in range(20):
        waste.pace.note(n * 1.0)  # one request a second
    entry = (19.3, 0.3, 0.0)  # 0.3 s queued everywhere
    factor = waste.factor(19.0, 0.3, len(THREE)) * waste.fade(19.0, entry)
    assert factor == pytest.approx(1.0 * 0.3 / 3 / 1.1)


def burst(policy: DefaultPolicy, queued: dict[str, float]) -> None:
    """At time 0 a group's system prompt (32 blocks) goes to ``a``, then fillers queue."""
    policy.on_routed(request("opener", hashes=chain(1, 32)), "a", 0.0)
    for where, seconds in queued.items():
        name = f"filler-{where}"
        filler = request(name, hashes=(hash(name),), prompt_chars=round(seconds * CHARS_PER_S))
        policy.on_routed(filler, where, 0.0)


@pytest.mark.parametrize(
    ("waste", "queued", "chosen", "reason"),
    [
        # a: 171 ms of prompt + 280 ms more; b and c 150 ms. Recomputing the prompt on b
        # is quicker for this request alone, so without the term the sibling leaves ...
        (0.0, {"a": 0.28, "b": 0.15, "c": 0.15}, "b", "least_ttft"),
        # ... but in a burst the recompute delays every request queued behind it.
        (2.0, {"a": 0.28, "b": 0.15, "c": 0.15}, "a", "prefix_match"),
        # An idle worker's capacity is free: then the sibling leaves all the same.
        (2.0, {"a": 0.28, "b": 0.15}, "c", "least_ttft"),
    ],
)
def test_a_sibling_in_a_burst_stays_with_its_groups_prompt(
    waste: float, queued: dict[str, float], chosen: str, reason: str
) -> None:
    policy = DefaultPolicy(DefaultConfig(waste=waste))
    burst(policy, queued)
    sibling = request("sibling", hashes=(*chain(1, 32), 7))
    decision = policy.pick(sibling, ctx(fleet(*THREE)))
    assert (decision.worker, decision.reason) == (chosen, reason)


def test_rescoring_charges_only_workers_short_of_the_holders_cache() -> None:
    a, b, c = THREE
    scored = [(1.0, a), (0.5, b), (0.6, c)]  # b is cheapest before the charge
    held = {"a": 100, "b": 0, "c": 90}
    best = rescore(scored, lambda w: held[w.id], 100, 0.01, lambda w: (0, 0.0, 0.0, w.id))
    # b pays 100 chars x 0.01 = 1.0 more, c 10 x 0.01 = 0.1: c (0.7) beats a (1.0).
    assert best is c
    assert scored == [(1.0, a), (1.5, b), (pytest.approx(0.7), c)]
