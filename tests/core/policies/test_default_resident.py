"""Table tests of the default policy on stale cache claims: what the TTFT terms count.

A worker with 50 blocks of KV (its index share remembers 100) that was sent more
than 75 blocks after a conversation's turn has most likely evicted that turn: its
next turn recomputes there, and the queue estimate and the request's own prefill
say so, while the pull still weighs the index's claim. One 256-character block is
64 tokens, 5.33 ms of prefill at the default 12,000 tokens/s.
"""

from __future__ import annotations

import pytest

from kvgate.core.policies.default import DefaultPolicy
from kvgate.core.policy import Resident, RouteContext

from .tables import chain, ctx, fleet, request, worker

KV = 64 * 50  # 50 index blocks of KV per worker
WORKERS = (worker("a", kv_capacity_tokens=KV), worker("b", kv_capacity_tokens=KV))
BLOCK_S = 64 / 12_000


def warm(policy: DefaultPolicy, where: str, blocks: int, group: int) -> None:
    """Send ``blocks`` blocks of strangers' chains to ``where`` 5 s ago: their queue has
    drained, and the fill they leave is still charged in full (``Warming._charge``)."""
    for i in range(blocks // 5):
        policy.on_routed(request(f"{where}{group}-{i}", hashes=chain(group + i, 5)), where, -5.0)


def learned() -> DefaultPolicy:
    policy = DefaultPolicy()
    for w in WORKERS:
        policy.index.set_kv_capacity(w.id, w.kv_capacity_tokens)
    return policy


@pytest.mark.parametrize(
    ("later", "queued_blocks"),
    [
        (0, 2),  # the first turn is resident: only the 2 new blocks queue
        (60, 2),
        (80, 12),  # the first turn was sent 80 blocks ago: all 12 recompute
    ],
)
def test_the_queue_estimate_counts_a_stale_claim_as_work(later: int, queued_blocks: int) -> None:
    policy = learned()
    policy.on_routed(request("t1", hashes=chain(1, 10)), "a", -100.0)
    warm(policy, "a", later, 100)
    policy.on_routed(request("t2", hashes=chain(1, 12)), "a", 0.0)
    assert policy.queued_tokens("a", 0.0) == pytest.approx(64 * queued_blocks)


# a routed the conversation's first turn (40 blocks), then ``later`` blocks of
# strangers, and has ``queued`` seconds of prefill ahead; b's cache is as full
# with strangers and b is idle. The next turn (44 blocks) stays on a while the
# cache there saves more than the queue costs. Once the turn is stale, a's
# expected TTFT counts all 44 blocks (235 ms) instead of 24 (128 ms): a queue of
# 0.2 s that the claimed cache would have outweighed sends it to b.
@pytest.mark.parametrize(
    ("later", "queued", "chosen"),
    [
        (30, 0.0, "a"),
        (30, 0.2, "a"),  # resident: the 40 cached blocks are worth the wait
        (80, 0.0, "a"),  # stale, but a is idle: its claim still pulls
        (80, 0.2, "b"),
    ],
)
def test_a_stale_claim_does_not_outweigh_a_queue(later: int, queued: float, chosen: str) -> None:
    policy = learned()
    policy.on_routed(request("t1", hashes=chain(1, 40)), "a", -100.0)
    warm(policy, "a", later, 100)
    warm(policy, "b", 100, 500)
    if queued:
        filler = request("filler", hashes=(7,), prompt_chars=round(queued * 12_000 * 4))
        policy.on_routed(filler, "a", 0.0)
    decision = policy.pick(request("t2", hashes=chain(1, 44)), ctx(fleet(*WORKERS)))
    assert decision.worker == chosen


@pytest.mark.parametrize(("confirmed", "chosen"), [(0, "a"), (3, "a"), (10, "b")])
def test_the_stores_claims_count_as_far_as_usage_has_confirmed_them(
    confirmed: int, chosen: str
) -> None:
    """Replica B never routed these chains; the store says another replica sent them to b.

    B counts none of such a claim in b's expected TTFT at first (its own index cannot
    vouch for it), so with 0.03 s queued on b (whose cache is full, so the pull of its
    cache has faded) a 42-block turn goes to idle a. Once b's usage reports have
    confirmed ten such claims (trust 1 - 0.9^10 = 0.65), B counts most of the next one
    and keeps the turn on b, as a gateway that had routed it would.
    """
    replica_b = learned()
    warm(replica_b, "b", 100, 500)  # b's cache is full of strangers' chains
    snapshot = fleet(*WORKERS)

    def turn() -> RouteContext:
        return RouteContext(snapshot, None, ctx(snapshot).rng, {"b": 40})

    def teach(claims: int) -> None:
        for n in range(claims):
            taught = request(f"x{n}", hashes=(*chain(10 + n, 40), 5, 6))
            replica_b.pick(taught, turn())
            replica_b.on_routed(taught, "b", -100.0)  # long ago: b's queue has drained
            replica_b.on_usage(taught, "b", 42 * 64, 40 * 64, -99.0)

    hashes = (*chain(1, 40), 5, 6)
    filler = request("filler", hashes=(7,), prompt_chars=round(0.03 * 48_000))
    if confirmed:
        teach(confirmed)
    replica_b.on_routed(filler, "b", 0.0)
    assert replica_b.pick(request("t", hashes=hashes), turn()).worker == chosen


@pytest.mark.parametrize("exact", [frozenset({"a", "b"}), {"a": 1, "b": 2}.keys(), ("a", "b")])
def test_a_fleet_all_publishing_events_is_read_from_the_engines_alone(exact: object) -> None:
    policy = learned()
    first = request("t1", hashes=chain(1, 10))
    policy.on_routed(first, "a", -100.0)  # the index: a holds 10 (and the turn ended)
    policy.on_usage(first, "a", 640, 0, -99.0)
    turn = request("t2", hashes=chain(1, 12))
    snapshot = fleet(*WORKERS)
    told = RouteContext(snapshot, None, ctx(snapshot).rng, {}, Resident({"b": 256 * 3}, exact))  # type: ignore[arg-type]
    assert policy.residency.matches(turn, told) == {"b": 3}  # a's claim was the index's: replaced
    some = RouteContext(snapshot, None, ctx(snapshot).rng, {}, Resident({"b": 256 * 3}, ("b",)))
    assert policy.residency.matches(turn, some) == {"a": 10, "b": 3}  # a publishes none: its index
