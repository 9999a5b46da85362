"""Rendezvous hashing with bounded loads."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kvgate.core.fleet import WorkerState
from kvgate.core.hashing import (
    bounded_load_cap,
    bounded_rendezvous,
    key_hash,
    rendezvous_order,
)

WORKERS = tuple(WorkerState(id=f"http://w{i}", model="m") for i in range(8))


def test_order_depends_on_key_and_ids_only() -> None:
    key = key_hash("session-42")
    forward = [w.id for w in rendezvous_order(key, WORKERS)]
    backward = [w.id for w in rendezvous_order(key, WORKERS[::-1])]
    assert forward == backward
    assert sorted(forward) == sorted(w.id for w in WORKERS)


def test_removing_a_worker_moves_only_its_own_keys() -> None:
    keys = [key_hash(f"k{i}") for i in range(500)]
    before = {k: rendezvous_order(k, WORKERS)[0].id for k in keys}
    gone = WORKERS[3].id
    after = {k: rendezvous_order(k, [w for w in WORKERS if w.id != gone])[0].id for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == gone}
    assert 0 < len(moved) < len(keys) / 4


def test_keys_spread_over_workers() -> None:
    counts: dict[str, int] = {}
    for i in range(4000):
        first = rendezvous_order(key_hash(f"k{i}"), WORKERS)[0].id
        counts[first] = counts.get(first, 0) + 1
    assert len(counts) == len(WORKERS)
    assert max(counts.values()) < 2 * min(counts.values())


@pytest.mark.parametrize(
    ("total", "workers", "factor", "slack", "cap"),
    [
        (0, 4, 1.25, 0, 1),
        (31, 8, 1.25, 0, 5),
        (31, 8, 1.5, 2, 8),
        (100, 1, 1.25, 0, 127),
        (5, 0, 1.25, 0, 0),
    ],
)
def test_bounded_load_cap(total: int, workers: int, factor: float, slack: int, cap: int) -> None:
    assert bounded_load_cap(total, workers, factor, slack) == cap


@pytest.mark.parametrize("factor", [1.0, 1.25, 2.0])
def test_one_hot_key_never_pushes_a_worker_past_the_bound(factor: float) -> None:
    fleet = list(WORKERS)
    key = key_hash("hot")
    for placed in range(1, 200):
        chosen = bounded_rendezvous(key, fleet, factor)
        assert chosen is not None
        worker, _ = chosen
        fleet = [replace(w, in_flight=w.in_flight + 1) if w.id == worker.id else w for w in fleet]
        assert max(w.load for w in fleet) <= math.ceil(factor * placed / len(fleet))


def test_first_choice_then_walk() -> None:
    key = key_hash("k")
    first = rendezvous_order(key, WORKERS)[0]
    assert bounded_rendezvous(key, WORKERS, 1.25) == (first, False)
    loaded = [replace(w, in_flight=10) if w.id == first.id else w for w in WORKERS]
    worker, walked = bounded_rendezvous(key, loaded, 1.25) or (None, None)
    assert walked is True
    assert worker is not None and worker.id != first.id
    assert bounded_rendezvous(key, [], 1.25) is None
