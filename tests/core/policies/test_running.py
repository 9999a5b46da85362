"""``RunningBlocks.shared_depths`` against a walk of every busy worker's counts."""

from __future__ import annotations

import random

import pytest

from kvgate.core.policies.running import RunningBlocks
from kvgate.engine.blocks import chain_hashes


def _walked(running: RunningBlocks, hashes: list[int], among: set[str]) -> list[tuple[str, int]]:
    """What ``shared_depths`` answered before it kept the chains' first blocks."""
    found = []
    for worker, counts in running._counts.items():
        if hashes and hashes[0] in counts and worker in among:
            depth = 0
            for h in hashes:
                if h not in counts:
                    break
                depth += 1
            found.append((worker, depth))
    return found


@pytest.mark.parametrize("seed", range(20))
def test_shared_depths_equal_a_walk_of_every_worker(seed: int) -> None:
    rng = random.Random(seed)
    openings = [[rng.randrange(1000) for _ in range(32)] for _ in range(3)]
    chains = [
        chain_hashes(rng.choice(openings) + [rng.randrange(1000) for _ in range(32)], 16)[
            : rng.randrange(0, 5)
        ]
        for _ in range(12)
    ]
    workers = [f"w{i}" for i in range(6)]
    running = RunningBlocks(limit=rng.choice([4, 64]))
    for _ in range(300):
        move = rng.random()
        if move < 0.5:
            running.fly(f"r{rng.randrange(40)}", rng.choice(workers), rng.choice(chains))
        elif move < 0.9:
            running.landed(f"r{rng.randrange(40)}")
        elif move < 0.95:
            running.remove(rng.choice(workers), rng.choice(chains))  # unmatched: drift
        else:
            running.forget(rng.choice(workers))
        among = set(rng.sample(workers, rng.randrange(1, 7)))
        for chain in chains:
            assert list(running.shared_depths(chain, among)) == _walked(running, chain, among)
