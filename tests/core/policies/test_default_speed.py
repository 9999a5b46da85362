"""With ``learned_speed``, ``default`` reasons with each worker's learned speed; the
configured rates are only its prior.

A worker learned 80x slower than the prior (a one-thread llama.cpp behind the H100
prior: ~150 tokens/s against 12,000) has its queue drained at its own rate, so work
queued there a second ago still stands in the way of the next request.
"""

from __future__ import annotations

import pytest

from kvgate.core.policies.default import DefaultConfig, DefaultPolicy
from kvgate.core.speed import Observation

from .tables import chain, ctx, fleet, request, worker

PRIOR = 12_000.0  # tokens/s
SLOW = 80.0  # the slow worker's seconds per token over the prior's


def learn(policy: DefaultPolicy, where: str, slowness: float, at: float, n: int = 10) -> float:
    """``n`` lone 400-token requests on ``where``, one after another from ``at``, each with
    a TTFT ``slowness`` times the prior's; returns the time after the last."""
    for i in range(n):
        req = request(f"{where}-learn{i}", hashes=chain(900 + i, 1), prompt_chars=1600)
        policy.on_routed(req, where, at)
        ttft = slowness * 400 / PRIOR
        policy.on_first_token(req, where, at + ttft)
        policy.on_usage(req, where, 400, 0, at + ttft + 0.01)
        policy.on_observed(req, where, Observation(ttft, 400, 0), at + ttft + 0.01)
        at += ttft + 0.1
    return at


@pytest.mark.parametrize("learned", [True, False])
def test_a_worker_learned_slow_drains_its_queue_at_its_own_rate(learned: bool) -> None:
    policy = DefaultPolicy(DefaultConfig(learned_speed=learned))
    now = learn(policy, "a", SLOW, 0.0)
    now = learn(policy, "b", 1.0, now)
    # Learned either way; only ``learned_speed`` makes the costs read it.
    assert policy.speed.speed("a").prefill_s == pytest.approx(SLOW / PRIOR, rel=0.05)
    assert policy.speed.speed("b").prefill_s == pytest.approx(1.0 / PRIOR, rel=0.05)
    # a holds the prompt's first 8 blocks, and 4,000 tokens were queued there 1 s ago.
    warm = request("warm", hashes=chain(1, 8))
    policy.on_routed(warm, "a", now - 5.0)
    policy.on_usage(warm, "a", 512, 0, now - 4.0)
    policy.on_routed(request("big", hashes=(7,), prompt_chars=16_000), "a", now - 1.0)
    queued = policy.queued_tokens("a", now)
    # Drained for 1 s: at the learned 150 tokens/s, or at the prior's 12,000 (all of it).
    assert queued == pytest.approx(4000 - PRIOR / SLOW if learned else 0.0, rel=0.01)
    decision = policy.pick(
        request("next", hashes=chain(1, 10)), ctx(fleet(worker("a"), worker("b"), now=now))
    )
    # Learned: a's queue (26 s there) outweighs its cache; on the prior, the cache wins.
    assert decision.worker == ("b" if learned else "a")


def test_a_worker_never_observed_is_costed_at_the_fleets_speed() -> None:
    """A worker with no book yet is costed at the fleet's learned speed, not the prior."""
    policy = DefaultPolicy(DefaultConfig(learned_speed=True))
    learn(policy, "a", SLOW, 0.0)
    assert policy.speed.fleet().prefill_s == pytest.approx(SLOW / PRIOR, rel=0.05)
    _, _, _, _, per_token, pace, *_ = policy._queues.idle
    assert per_token == pytest.approx(SLOW / PRIOR, rel=0.05)
    assert pace == pytest.approx(SLOW, rel=0.05)


def evicting(evict: float) -> tuple[DefaultPolicy, dict[str, float]]:
    """A policy learned a 2x slower than b, both caches as full, and its costs of placing
    an uncached request on each (``evict``: ``DefaultConfig.evict``)."""
    policy = DefaultPolicy(DefaultConfig(learned_speed=True, evict=evict))
    now = learn(policy, "a", 2.0, 0.0, n=30)
    now = learn(policy, "b", 1.0, now, n=30)
    for where in ("a", "b"):  # the same 4,000 tokens sent to each: the same fill
        fill = request(f"fill-{where}", hashes=chain(7, 60), prompt_chars=16_000)
        policy.on_routed(fill, where, now)
        policy.on_usage(fill, where, 4000, 0, now + 1.0)
    snapshot = fleet(worker("a"), worker("b"), now=now + 2.0)
    policy.pick(request("next", hashes=chain(8, 4), prompt_chars=4000), ctx(snapshot))
    return policy, policy._scored.by_id()


def test_what_a_placement_evicts_is_costed_at_the_fleets_pace_not_the_workers() -> None:
    """The cache a placement evicts costs the later requests that would have hit it their
    prefill wherever they go: a worker learned slow is charged its own prefill at its
    pace, but not that eviction twice over (which kept a slowed worker starved)."""
    policy, full = evicting(1.0)
    _, none = evicting(0.0)
    fill = {w: policy._costs[w][3] for w in ("a", "b")}
    assert fill["a"] == pytest.approx(fill["b"]) and fill["a"] > 0.0
    evicted = {w: full[w] - none[w] for w in ("a", "b")}
    assert evicted["a"] > 0.0
    assert evicted["a"] == pytest.approx(evicted["b"])
