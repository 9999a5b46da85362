"""What the other gateway replicas have in flight on each worker (issue 47).

A replica counts only what it sent: behind two replicas each sees half of every
worker's load, and both pile onto the same worker. So every ``LOADS_EVERY_S`` each
replica publishes its own per-worker counts (requests in flight and the KV tokens
they will hold) to the shared store, under its own name with a TTL, and reads every
live replica's in the same round trip (``AffinityStore.exchange_loads``); a replica
that stops publishing (dead, partitioned) drops out when its TTL runs out, and its
counts with it. What the others publish is added to each worker's own counts
(``Routed.peered``): the snapshot's ``in_flight`` and ``kv_in_flight_tokens`` are the
fleet's, at most one period old. One replica alone finds no one else: nothing changes.

Pure: the drivers (the live gateway's ``control.peers``, the simulator's
``sim.replicas``) carry out the exchange.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from kvgate.types import Seconds, WorkerId

Counts = dict[WorkerId, tuple[int, int]]
"""Worker -> (requests in flight, their KV tokens)."""

LOADS_EVERY_S: Seconds = 0.1
"""How often a replica publishes its counts and reads the others'."""

LOADS_TTL_S: Seconds = 1.0
"""How long a publication lives: a replica silent for this long has gone."""

MAX_REPLICAS = 1_024
"""Publications a store keeps at most (a bound on what a misbehaving fleet can write)."""


def counts_of(loads: Iterable[tuple[WorkerId, int, int]]) -> Counts:
    """One replica's own counts to publish: the workers with anything in flight."""
    return {w: (n, kv) for w, n, kv in loads if n or kv}


def encode(counts: Counts) -> bytes:
    """``counts`` as the store keeps them (compact JSON, one list a worker)."""
    return json.dumps([[w, n, kv] for w, (n, kv) in counts.items()], separators=(",", ":")).encode()


def decode(data: bytes | str) -> Counts:
    """A publication read back; one that is not (another version, garbage) counts nothing."""
    try:
        rows = json.loads(data)
        return {
            WorkerId(w): (int(n), int(kv))
            for w, n, kv in rows
            if isinstance(w, str) and n >= 0 and kv >= 0
        }
    except (ValueError, TypeError):
        return {}


def others(published: Mapping[str, bytes | str], me: str) -> Counts:
    """The sum over every replica but ``me`` of what it published, per worker."""
    total: Counts = {}
    for replica, data in published.items():
        if replica == me:
            continue
        for worker, (n, kv) in decode(data).items():
            had = total.get(worker, (0, 0))
            total[worker] = (had[0] + n, had[1] + kv)
    return total
