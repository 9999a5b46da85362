"""Table tests of ``cache_aware``, the model of sglang-router's policy: imbalance first,
then the longest match over the threshold, then the smallest tree."""

from __future__ import annotations

import pytest

from kvgate.core.policies.cache_aware import CacheAware, CacheAwareConfig

from .tables import chain, ctx, fleet, pick_on_loads, request, worker


def warmed(config: CacheAwareConfig | None = None) -> CacheAware:
    """a's tree holds group 1 (8 blocks), b's group 1's first 2 and group 2 (20 blocks)."""
    policy = CacheAware(config)
    policy.on_routed(request("w1", hashes=chain(1, 8)), "a", 0.0)
    policy.on_routed(request("w2", hashes=chain(1, 2)), "b", 0.0)
    policy.on_routed(request("w3", hashes=chain(2, 20)), "b", 0.0)
    return policy


@pytest.mark.parametrize(
    ("loads", "hashes", "chosen", "reason"),
    [
        # a holds 8 of 10 blocks: over 30%, so a, busier or not (no imbalance below 64).
        ({"a": 60, "b": 0, "c": 0}, chain(1, 10), "a", "prefix_match"),
        # Imbalanced: 70 - 2 > 64 and 70 > 1.5 x 2; the least loaded, whatever it holds.
        ({"a": 70, "b": 2, "c": 5}, chain(1, 10), "b", "imbalance_least_loaded"),
        # 70 - 0 > 64 but 70 > 1.5 x 0 holds too: any idle worker breaks the balance.
        ({"a": 70, "b": 0, "c": 9}, chain(2, 4), "b", "imbalance_least_loaded"),
        # 2 of 10 blocks held anywhere: not over 30%; c's tree is empty, the smallest.
        ({"a": 0, "b": 0, "c": 9}, (*chain(1, 2), *chain(7, 8)), "c", "smallest_tree"),
        # Unseen, and c busy: still the smallest tree (the rule does not look at load).
        ({"a": 0, "b": 0, "c": 30}, chain(5, 4), "c", "smallest_tree"),
    ],
)
def test_cache_aware_table(
    loads: dict[str, int], hashes: tuple[int, ...], chosen: str, reason: str
) -> None:
    decision = pick_on_loads(warmed(), loads, hashes)
    assert (decision.worker, decision.reason) == (chosen, reason)
    assert decision.affinity is None


def test_a_match_must_cover_more_than_the_threshold() -> None:
    """3 of 10 blocks is exactly 30%: not more, so the smallest tree (c) takes it."""
    policy = warmed()
    policy.on_routed(request("w4", hashes=chain(3, 3)), "a", 0.0)
    snapshot = fleet(worker("a"), worker("b"), worker("c"))
    exact = (*chain(3, 3), *chain(8, 7))
    assert policy.pick(request(hashes=exact), ctx(snapshot)).worker == "c"
    more = (*chain(3, 3), *chain(9, 6))
    assert policy.pick(request(hashes=more, prompt_chars=9 * 256), ctx(snapshot)).worker == "a"


def test_the_tree_counts_only_what_it_did_not_hold() -> None:
    policy = CacheAware()
    policy.on_routed(request("r1", hashes=chain(1, 8)), "a", 0.0)
    policy.on_routed(request("r2", hashes=(*chain(1, 8), *chain(4, 2))), "a", 0.0)
    policy.on_routed(request("r3", hashes=chain(1, 8)), "b", 0.0)
    assert (policy.tree_chars("a"), policy.tree_chars("b"), policy.tree_chars("c")) == (
        10 * 256,
        8 * 256,
        0,
    )


def test_new_content_spreads_by_tree_size_and_a_shared_prompt_stays_put() -> None:
    """Strangers sharing an 8-block prompt (8 of 10 blocks) all join its first worker;
    unrelated prompts go round the fleet by what each tree has been sent."""
    policy = CacheAware()
    snapshot = fleet(worker("a"), worker("b"), worker("c"))
    placed = []
    for n in range(6):
        hashes = (*chain(1, 8), *chain(100 + n, 2))
        decision = policy.pick(request(f"s{n}", hashes=hashes), ctx(snapshot))
        policy.on_routed(request(f"s{n}", hashes=hashes), decision.worker or "", 0.0)
        placed.append(decision.worker)
    assert placed == ["a"] * 6
    spread = []
    for n in range(3):
        hashes = chain(200 + n, 30)
        decision = policy.pick(request(f"u{n}", hashes=hashes), ctx(snapshot))
        policy.on_routed(request(f"u{n}", hashes=hashes), decision.worker or "", 0.0)
        spread.append(decision.worker)
    # a's tree holds 20 blocks (the prompt once, then 2 of each stranger's own): the
    # empty b (first in fleet order among equals), the empty c, then a (20 against 30).
    assert spread == ["b", "c", "a"]


def test_the_tree_knows_nothing_of_kv_capacity() -> None:
    """Unlike ``prefix_affinity``'s index, the tree keeps what was sent far past any KV
    capacity: a prompt sent 2,000 prompts ago still matches."""
    policy = CacheAware()
    policy.on_routed(request("old", hashes=chain(1, 8)), "a", 0.0)
    for n in range(2000):
        policy.on_routed(request(f"x{n}", hashes=chain(10 + n, 8)), "a", 0.0)
    snapshot = fleet(worker("a", kv_capacity_tokens=1024), worker("b"))
    decision = policy.pick(request(hashes=(*chain(1, 8), 5)), ctx(snapshot))
    assert (decision.worker, decision.reason) == ("a", "prefix_match")


def test_a_removed_worker_is_forgotten() -> None:
    policy = warmed()
    policy.on_worker_removed("a")
    assert policy.tree_chars("a") == 0
    snapshot = fleet(worker("a"), worker("c"))
    assert policy.pick(request(hashes=chain(1, 10)), ctx(snapshot)).reason == "smallest_tree"
