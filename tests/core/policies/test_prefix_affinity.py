"""Table tests of prefix_affinity: best match, load overrides, herding, index feedback."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from kvgate.core.fleet import FleetSnapshot
from kvgate.core.policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig

from .tables import chain, ctx, fleet, pick_on_loads, request, worker


def warmed(config: PrefixAffinityConfig | None = None) -> PrefixAffinity:
    """A policy whose index says: a holds group 1 (8 blocks), b holds group 1's first 2."""
    policy = PrefixAffinity(config)
    policy.on_routed(request("w1", hashes=chain(1, 8)), "a", 0.0)
    policy.on_routed(request("w2", hashes=chain(1, 2)), "b", 0.0)
    return policy


@pytest.mark.parametrize(
    ("loads", "hashes", "chosen", "reason"),
    [
        ({"a": 3, "b": 3, "c": 0}, chain(1, 8), "a", "prefix_match"),
        # a's match (10/12 blocks) beats b's (2/12) though a is busier.
        ({"a": 4, "b": 2, "c": 3}, chain(1, 12), "a", "prefix_match"),
        # Only b's 2 of 10 blocks match: under the 0.3 threshold.
        ({"a": 3, "b": 3, "c": 0}, chain(1, 10, tail=None)[:2] + chain(7, 8), "c", "least_loaded"),
        # An unseen prompt.
        ({"a": 0, "b": 1, "c": 2}, chain(5, 4), "a", "least_loaded"),
        # a is past the bounded-load cap: ceil(1.5 * 13 / 3) + 2 = 9.
        ({"a": 9, "b": 2, "c": 1}, chain(1, 8), "c", "imbalance_least_loaded"),
    ],
)
def test_prefix_affinity_table(
    loads: dict[str, int], hashes: tuple[int, ...], chosen: str, reason: str
) -> None:
    decision = pick_on_loads(warmed(), loads, hashes)
    assert (decision.worker, decision.reason) == (chosen, reason)
    assert decision.affinity is None


def test_sglang_imbalance_rule_still_applies() -> None:
    config = PrefixAffinityConfig(bounded_load_factor=100, balance_abs=2, balance_rel=1.5)
    snapshot = fleet(worker("a", in_flight=6), worker("b", in_flight=3), worker("c", in_flight=3))
    decision = warmed(config).pick(request(hashes=chain(1, 8)), ctx(snapshot))
    assert decision.reason == "imbalance_least_loaded"


def test_high_kv_usage_loses_the_match() -> None:
    snapshot = fleet(worker("a", kv_usage=0.95), worker("b"), worker("c"))
    decision = warmed().pick(request(hashes=chain(1, 8)), ctx(snapshot))
    assert decision.reason == "imbalance_least_loaded"
    assert decision.worker != "a"


def test_no_herding_at_concurrency_32() -> None:
    """Users' complaint #1: 32 concurrent requests of one prefix group on 8 workers."""
    policy = PrefixAffinity()
    snapshot: FleetSnapshot = fleet(*(worker(f"w{i}") for i in range(8)))
    counts: Counter[str] = Counter()
    for n in range(32):
        req = request(f"r{n}", hashes=chain(1, 8, tail=10_000 + n))
        decision = policy.pick(req, ctx(snapshot))
        assert decision.worker is not None
        policy.on_routed(req, decision.worker, 0.0)
        counts[decision.worker] += 1
        snapshot = fleet(
            *(
                replace(w, in_flight=w.in_flight + (w.id == decision.worker))
                for w in snapshot.workers
            )
        )
    hot = max(counts.values())
    assert hot <= 8  # the bounded-load cap at 32 in flight: ceil(1.5 * 32 / 8) + 2
    assert hot > 32 / 8  # but affinity still concentrates the group
    assert len(counts) > 1


def test_index_capacity_is_taken_from_the_workers_kv_capacity() -> None:
    policy = PrefixAffinity()
    snapshot = fleet(worker("a", kv_capacity_tokens=64 * 10))  # 10 blocks of 64 tokens
    req = request(hashes=chain(1, 4))
    decision = policy.pick(req, ctx(snapshot))
    policy.on_routed(req, "a", 0.0)
    assert decision.worker == "a"
    assert policy.index.capacity("a") == 20  # 10 blocks of KV, remembered twice over


def test_usage_feedback_and_worker_removal_reach_the_index() -> None:
    policy = warmed()
    req = request("r", hashes=chain(1, 8))
    policy.on_routed(req, "a", 0.0)
    before = policy.index.capacity("a")
    policy.on_usage(req, "a", prompt_tokens=512, cached_tokens=0, now=1.0)
    assert policy.index.capacity("a") < before
    policy.on_worker_removed("a")
    snapshot = fleet(worker("a"), worker("b", in_flight=1), worker("c", in_flight=1))
    assert policy.pick(request(hashes=chain(1, 8)), ctx(snapshot)).reason == "least_loaded"
