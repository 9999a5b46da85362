"""Warm-ups in the simulator (on by default): sent as the live gateway sends them,
counted apart from the clients' requests, and they take the cold copies off the short
run's slowest requests (the figures ``docs/benchmarks.md`` reports come from the same runs)."""

from __future__ import annotations

from kvgate.sim.simulation import SimConfig, Simulation
from kvgate.workload.synthetic import build_workload


def run(seed: int, options: dict[str, object]) -> dict[str, object]:
    config = SimConfig(workers=4, kv_blocks=(2000,), block_size=16, seed=seed, max_requests=240)
    workload = build_workload("headerless-chat:vary=1.0", seed=seed)
    return Simulation(config, workload.requests(), "default", options, misses=True).run().summary


def test_warm_ups_are_sent_counted_apart_and_cut_the_shared_copies() -> None:
    # Seed 113: on 110 the openings made no shared copy to cut since the fill a worker
    # is charged follows what it was sent lately (``FleetSpeed.lately``).
    before, after = run(113, {"warm_min_blocks": 0}), run(113, {})
    assert before["warm_ups"] == 0 and before["warm_up_tokens"] == 0
    assert after["warm_ups"] > 0
    assert after["warm_up_tokens"] >= after["warm_ups"] * 4 * 16  # at least 4 blocks each
    # No client request was added or lost: warm-ups are not requests.
    assert after["finished"] + after["shed"] == before["finished"] + before["shed"] == 240
    # The copies of shared text the openings made are made ahead instead.
    shared = lambda s: s["misses"]["tokens"]["shared"]  # noqa: E731
    assert shared(after) < shared(before)
