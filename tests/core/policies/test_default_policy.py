"""Table tests of the default policy: stickiness, prefix placement, spreading, hash fallback."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvgate.core.fleet import Health, Pressure
from kvgate.core.hashing import rendezvous_order
from kvgate.core.policies.default import DefaultConfig, DefaultPolicy

from .tables import chain, ctx, fleet, request, worker

THREE = (worker("a"), worker("b"), worker("c"))


def with_loads(**loads: int) -> tuple:
    return tuple(replace(w, in_flight=loads.get(w.id, 0)) for w in THREE)


@pytest.mark.parametrize(
    ("workers", "bound_to", "chosen", "reason"),
    [
        (with_loads(a=2, b=0, c=0), "a", "a", "affinity_hit"),
        # Soft pressure keeps an affine session.
        ((replace(THREE[0], pressure=Pressure.SOFT), *THREE[1:]), "a", "a", "affinity_hit"),
        # Past the sticky cap ceil(2.0 * 15 / 3) + 4 = 14.
        (with_loads(a=14, b=0, c=0), "a", None, "affinity_overloaded_migrated"),
        (
            (replace(THREE[0], health=Health.DRAINING), *THREE[1:]),
            "a",
            None,
            "affinity_lost_migrated",
        ),
        (
            (replace(THREE[0], pressure=Pressure.HARD), *THREE[1:]),
            "a",
            None,
            "affinity_pressure_migrated",
        ),
    ],
)
def test_known_sessions(workers: tuple, bound_to: str, chosen: str | None, reason: str) -> None:
    decision = DefaultPolicy().pick(
        request(session="s", hashes=chain(1, 4)), ctx(fleet(*workers), bound_to)
    )
    assert decision.reason == reason
    if chosen is not None:
        assert decision.worker == chosen
        assert decision.affinity is None
    else:
        assert decision.worker not in (None, "a")
        assert decision.affinity is not None
        assert decision.affinity.expected == "a"
        assert decision.affinity.worker == decision.worker


def test_new_session_goes_where_its_prefix_is_cached() -> None:
    policy = DefaultPolicy()
    policy.on_routed(request("w", hashes=chain(1, 8)), "c", 0.0)
    decision = policy.pick(request(session="s", hashes=chain(1, 8)), ctx(fleet(*with_loads(c=1))))
    assert (decision.worker, decision.reason) == ("c", "prefix_match")
    assert decision.affinity is not None
    assert (decision.affinity.session_key, decision.affinity.expected) == ("s", None)


# With 256-character blocks and load_cost_tokens 256, one request of load weighs
# as much as 4 cached blocks (1,024 characters, 256 tokens).
@pytest.mark.parametrize(
    ("cached_blocks", "load_on_c", "chosen", "reason"),
    [
        (8, 1, "c", "prefix_match"),  # 8 cached blocks beat 1 request of load
        (8, 2, "a", "imbalance_least_loaded"),  # a tie in cost: the lower load wins
        (8, 3, "a", "imbalance_least_loaded"),  # a short prefix is cheap to recompute
        (32, 6, "c", "prefix_match"),  # a long one (a document) is worth the wait
        (32, 9, "a", "imbalance_least_loaded"),
    ],
)
def test_new_session_weighs_its_cached_prefix_against_load(
    cached_blocks: int, load_on_c: int, chosen: str, reason: str
) -> None:
    policy = DefaultPolicy(DefaultConfig(bounded_load_factor=10.0))
    policy.on_routed(request("w", hashes=chain(1, cached_blocks)), "c", 0.0)
    prompt = (*chain(1, cached_blocks), 98, 99)  # the cached prefix and a new question
    decision = policy.pick(
        request(session="s", hashes=prompt), ctx(fleet(*with_loads(c=load_on_c)))
    )
    assert (decision.worker, decision.reason) == (chosen, reason)


def test_new_sessions_sharing_a_system_prompt_spread_instead_of_herding() -> None:
    """The herding of issue 4: every new chat session shares the app's system prompt.

    Before, each went to the worker holding it (then to that prompt's hash
    choice): most workers served nothing. Now the load they add spreads them.
    """
    workers = [worker(f"w{i}") for i in range(8)]
    loads = dict.fromkeys((w.id for w in workers), 0)
    policy = DefaultPolicy()
    for n in range(40):
        snapshot = fleet(*(replace(w, in_flight=loads[w.id]) for w in workers))
        hashes = (*chain(1, 8), 10_000 + n, 20_000 + n)  # system prompt, own message
        decision = policy.pick(request(f"r{n}", session=f"s{n}", hashes=hashes), ctx(snapshot))
        assert decision.worker is not None
        policy.on_routed(request(f"r{n}", hashes=hashes), decision.worker, 0.0)
        loads[decision.worker] += 1
    assert max(loads.values()) - min(loads.values()) <= 1
    assert min(loads.values()) > 0


def test_a_trickle_of_new_sessions_at_zero_load_takes_turns() -> None:
    """At low load every worker ties at zero: recent routing, not the id, breaks it."""
    policy = DefaultPolicy()
    chosen = []
    for n in range(6):
        snapshot = fleet(*THREE, now=float(n))
        hashes = chain(100 + n, 4)
        decision = policy.pick(request(f"r{n}", session=f"s{n}", hashes=hashes), ctx(snapshot))
        assert decision.worker is not None
        policy.on_routed(request(f"r{n}", hashes=hashes), decision.worker, float(n))
        chosen.append(decision.worker)
    assert sorted(chosen) == ["a", "a", "b", "b", "c", "c"]


def test_new_session_without_a_cached_prefix_goes_least_loaded() -> None:
    workers = with_loads(a=2, b=0, c=1)
    decision = DefaultPolicy().pick(request(session="s", hashes=chain(9, 8)), ctx(fleet(*workers)))
    assert (decision.worker, decision.reason) == ("b", "least_loaded")
    assert decision.affinity is not None and decision.affinity.session_key == "s"


def test_unbound_request_without_a_cached_prefix_takes_the_hash_choice() -> None:
    hashes = chain(9, 8)
    expected = rendezvous_order(hashes[3], THREE)[0].id
    config = DefaultConfig(use_prefix_key=False)
    replica_one, replica_two = DefaultPolicy(config), DefaultPolicy(config)
    one = replica_one.pick(request(prefix_key="prefix:x", hashes=hashes), ctx(fleet(*THREE)))
    two = replica_two.pick(request(hashes=hashes), ctx(fleet(*THREE)))
    assert one.worker == two.worker == expected
    assert (one.reason, one.affinity) == ("hash_primary", None)


def test_a_worker_at_high_kv_usage_takes_no_new_session() -> None:
    policy = DefaultPolicy()
    policy.on_routed(request("w", hashes=chain(1, 8)), "a", 0.0)
    workers = (replace(THREE[0], kv_usage=0.95), *THREE[1:])
    decision = policy.pick(request(session="s", hashes=chain(1, 8)), ctx(fleet(*workers)))
    assert decision.worker in ("b", "c")
    assert decision.reason == "imbalance_least_loaded"


def test_prefix_derived_key_is_bound_so_later_turns_stick() -> None:
    decision = DefaultPolicy().pick(
        request(prefix_key="prefix:ab", hashes=chain(2, 3)), ctx(fleet(*THREE))
    )
    assert decision.affinity is not None
    assert decision.affinity.session_key == "prefix:ab"
    off = DefaultPolicy(DefaultConfig(use_prefix_key=False))
    assert (
        off.pick(request(prefix_key="prefix:ab", hashes=chain(2, 3)), ctx(fleet(*THREE))).affinity
        is None
    )


def test_overloaded_warm_worker_is_skipped_by_the_bounded_load_cap() -> None:
    policy = DefaultPolicy()
    policy.on_routed(request("w", hashes=chain(1, 8)), "a", 0.0)
    decision = policy.pick(request(hashes=chain(1, 8)), ctx(fleet(*with_loads(a=20, b=1, c=1))))
    assert (decision.worker, decision.reason) == ("b", "imbalance_least_loaded")


def test_migration_with_nowhere_under_threshold_refuses() -> None:
    config = DefaultConfig(threshold_kind="in_flight", threshold=3)
    workers = with_loads(a=3, b=3, c=5)
    decision = DefaultPolicy(config).pick(request(session="s"), ctx(fleet(*workers), "a"))
    assert (decision.shed, decision.reason) == (True, "capacity_full")


def test_no_key_no_prompt_goes_least_loaded_unbound() -> None:
    decision = DefaultPolicy().pick(request(), ctx(fleet(*with_loads(a=1, b=0, c=2))))
    assert (decision.worker, decision.reason, decision.affinity) == ("b", "least_loaded", None)
