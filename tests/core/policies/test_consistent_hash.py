"""Table tests of consistent_hash: replicas agree, bounded walk, keys."""

from __future__ import annotations

from kvgate.core.fleet import Health
from kvgate.core.hashing import key_hash, rendezvous_order
from kvgate.core.policies.consistent_hash import ConsistentHash, ConsistentHashConfig

from .tables import chain, ctx, fleet, request, worker

WORKERS = [worker(f"w{i}") for i in range(6)]


def test_replicas_agree_without_shared_state() -> None:
    snapshot = fleet(*WORKERS)
    first, second = ConsistentHash(), ConsistentHash()
    for n in range(50):
        req = request(f"r{n}", session=f"s{n}")
        one, two = first.pick(req, ctx(snapshot, seed=1)), second.pick(req, ctx(snapshot, seed=2))
        assert one.worker == two.worker
        assert one.reason == "hash_primary"
        assert one.worker == rendezvous_order(key_hash(f"s{n}"), WORKERS)[0].id


def test_without_a_session_the_first_blocks_are_the_key() -> None:
    snapshot = fleet(*WORKERS)
    policy = ConsistentHash(ConsistentHashConfig(hash_blocks=3))
    same_opening = {
        policy.pick(request(f"r{n}", hashes=chain(1, 3) + chain(100 + n, 5)), ctx(snapshot)).worker
        for n in range(20)
    }
    assert len(same_opening) == 1
    spread = {
        policy.pick(request(f"q{n}", hashes=chain(n, 4)), ctx(snapshot)).worker for n in range(40)
    }
    assert len(spread) > 3


def test_a_loaded_primary_walks_to_the_next_choice() -> None:
    primary = rendezvous_order(key_hash("s"), WORKERS)[0].id
    second = rendezvous_order(key_hash("s"), WORKERS)[1].id
    loaded = [worker(w.id, in_flight=10 if w.id == primary else 1) for w in WORKERS]
    decision = ConsistentHash().pick(request(session="s"), ctx(fleet(*loaded)))
    assert (decision.worker, decision.reason) == (second, "hash_bounded_walk")


def test_an_ejected_primary_moves_only_its_keys() -> None:
    primary = rendezvous_order(key_hash("s"), WORKERS)[0].id
    ejected = [worker(w.id, health=Health.EJECTED) if w.id == primary else w for w in WORKERS]
    decision = ConsistentHash().pick(request(session="s"), ctx(fleet(*ejected)))
    assert decision.worker == rendezvous_order(key_hash("s"), WORKERS)[1].id


def test_nothing_to_hash_goes_least_loaded() -> None:
    snapshot = fleet(worker("a", in_flight=2), worker("b"))
    decision = ConsistentHash().pick(request(), ctx(snapshot))
    assert (decision.worker, decision.reason) == ("b", "least_loaded")
