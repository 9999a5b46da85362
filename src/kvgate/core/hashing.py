"""Deterministic hashing for placement: rendezvous ranking with bounded loads.

Gateway replicas that share no state agree on where a key goes because the
ranking depends only on the key and the worker ids. Bounded loads (Mirrokni,
Thorup and Zadimoghaddam, 2018) keep any worker from taking more than
``ceil(c × average load)``: the walk moves on to the key's next choice instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import xxhash

from kvgate.core.fleet import WorkerState

_MASK64 = (1 << 64) - 1


def key_hash(text: str, seed: int = 0) -> int:
    """A stable 64-bit hash of ``text`` (xxh3), the same in every process and run."""
    return int(xxhash.xxh3_64_intdigest(text.encode(), seed & _MASK64))


def rendezvous_score(key: int, worker_id: str) -> int:
    """The highest-random-weight score of ``worker_id`` for ``key``."""
    return int(xxhash.xxh3_64_intdigest(worker_id.encode(), key & _MASK64))


def rendezvous_order(key: int, workers: Sequence[WorkerState]) -> list[WorkerState]:
    """``workers`` in ``key``'s order of preference (best first).

    Ties (astronomically unlikely) are broken by worker id so the order is total.
    """
    return sorted(
        workers,
        key=lambda w: (rendezvous_score(key, w.id), w.id),
        reverse=True,
    )


def bounded_load_cap(total_load: int, workers: int, factor: float, slack: int = 0) -> int:
    """The most load one worker may hold after placing one more request.

    ``total_load`` is the load already on the ``workers`` candidates; the new
    request counts too, so the cap is never below one and at least one worker is
    always under it when ``factor >= 1``.
    """
    if workers <= 0:
        return 0
    return max(1, math.ceil(factor * (total_load + 1) / workers)) + slack


def bounded_rendezvous(
    key: int,
    workers: Sequence[WorkerState],
    factor: float,
    slack: int = 0,
) -> tuple[WorkerState, bool] | None:
    """The first worker in ``key``'s order whose load stays within the bounded cap.

    Returns ``(worker, walked)``: ``walked`` is False when the key's first choice
    took it. ``None`` only when ``workers`` is empty.
    """
    if not workers:
        return None
    seed = key & _MASK64
    digest = xxhash.xxh3_64_intdigest
    scores = [digest(w.id.encode(), seed) for w in workers]
    loads = [w.in_flight + (w.waiting or 0) for w in workers]
    cap = bounded_load_cap(sum(loads), len(workers), factor, slack)
    # The first choice almost always fits: find it without sorting everyone.
    # (Equal 64-bit scores, where order would matter, do not happen in practice.)
    first = scores.index(max(scores))
    if loads[first] < cap:
        return workers[first], False
    # The walk in rendezvous order stops at the best-scored worker under the cap.
    under = [score if load < cap else -1 for score, load in zip(scores, loads, strict=True)]
    best = max(under)
    if best >= 0:
        return workers[under.index(best)], True
    return min(workers, key=lambda w: (w.load, w.id)), True
