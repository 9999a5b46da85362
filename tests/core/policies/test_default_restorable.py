"""``default``: routing credits cache by where it lives (a slot, or a disk every worker reads)."""

from __future__ import annotations

from dataclasses import replace

from kvgate.core.policies.default import DefaultConfig, DefaultPolicy

from .tables import chain, ctx, fleet, request, worker

THREE = (worker("a"), worker("b"), worker("c"))


def _loads(**loads: int) -> tuple:
    return tuple(replace(w, in_flight=loads.get(w.id, 0)) for w in THREE)


def test_kv_on_disk_counts_everywhere_so_load_decides() -> None:
    policy = DefaultPolicy(DefaultConfig(bounded_load_factor=10.0))
    policy.on_routed(request("w", hashes=chain(1, 32)), "c", 0.0)
    prompt = (*chain(1, 32), 98, 99)
    # In c's cache only: a long prefix is worth waiting behind 6 requests on c.
    held = policy.pick(request(session="s", hashes=prompt), ctx(fleet(*_loads(c=6))))
    assert (held.worker, held.reason) == ("c", "prefix_match")
    # Restorable from disk on any worker at 0.9 of a cached block: an idle worker wins.
    portable = replace(request(session="s", hashes=prompt), restorable_blocks=32)
    moved = policy.pick(portable, ctx(fleet(*_loads(b=1, c=6))))
    assert (moved.worker, moved.reason) == ("a", "restorable_match")


def test_a_slot_still_counts_more_than_disk() -> None:
    policy = DefaultPolicy(DefaultConfig(bounded_load_factor=10.0))
    policy.on_routed(request("w", hashes=chain(1, 32)), "c", 0.0)
    portable = replace(request(session="s", hashes=(*chain(1, 32), 98)), restorable_blocks=32)
    # Equal load: c's own 32 blocks beat 0.9 x 32 restorable elsewhere.
    decision = policy.pick(portable, ctx(fleet(*_loads())))
    assert (decision.worker, decision.reason) == ("c", "prefix_match")
    # No credit for restorable blocks: the old behaviour.
    plain = DefaultPolicy(DefaultConfig(bounded_load_factor=10.0, restorable_credit=0.0))
    plain.on_routed(request("w", hashes=chain(1, 32)), "c", 0.0)
    assert plain.pick(portable, ctx(fleet(*_loads(c=6)))).worker == "c"
