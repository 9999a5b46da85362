"""Small builders for the fleet tables policy tests run on."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from kvgate.core.decision import Affinity, Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import FleetSnapshot, WorkerState
from kvgate.core.policy import Policy, RouteContext
from kvgate.types import SessionSource


def worker(worker_id: str, **fields: Any) -> WorkerState:
    """A worker of model ``m`` with the given fields."""
    return WorkerState(id=worker_id, model="m", **fields)


THREE = (worker("a"), worker("b"), worker("c"))
CHARS_PER_S = 12_000 * 4
"""Prompt characters prefilled per second at the priors (12,000 tokens/s, 4 characters a
token): one 256-character block is 64 tokens, 5.33 ms."""


def with_loads(**loads: int) -> tuple[WorkerState, ...]:
    """``THREE`` with the given requests in flight (worker id -> count; others 0)."""
    return tuple(replace(w, in_flight=loads.get(w.id, 0)) for w in THREE)


def queue(policy: Policy, where: str, seconds: float, name: str = "filler") -> None:
    """Route an uncached request of ``seconds`` of prefill to ``where`` at time 0."""
    filler = request(name, hashes=(hash(name),), prompt_chars=round(seconds * CHARS_PER_S))
    policy.on_routed(filler, where, 0.0)


def fleet(*workers: WorkerState, now: float = 0.0) -> FleetSnapshot:
    """A snapshot of ``workers``."""
    return FleetSnapshot(now, tuple(workers))


def ctx(
    snapshot: FleetSnapshot, bound_to: str | None = None, key: str = "s", seed: int = 0
) -> RouteContext:
    """A route context; ``bound_to`` sets the session's affinity."""
    affinity = Affinity(key, bound_to, "default") if bound_to is not None else None
    return RouteContext(snapshot, affinity, random.Random(seed))


def request(
    request_id: str = "r",
    *,
    session: str | None = None,
    hashes: tuple[int, ...] = (),
    pinned: str | None = None,
    prompt_chars: int | None = None,
) -> RequestFeatures:
    """A request; ``session`` is a client-supplied key (header).

    The prompt is 256 characters per block unless ``prompt_chars`` says otherwise.
    """
    return RequestFeatures(
        request_id=request_id,
        model="m",
        session_key=session,
        session_source=SessionSource.HEADER if session else SessionSource.NONE,
        prefix_hashes=hashes,
        prompt_chars=256 * len(hashes) if prompt_chars is None else prompt_chars,
        pinned_version=pinned,
    )


def chain(group: int, length: int, tail: int | None = None) -> tuple[int, ...]:
    """A fake hash chain: ``length`` blocks of ``group``'s prefix, the last replaced by ``tail``.

    Only equality matters to the index, so readable integers stand in for hashes.
    """
    blocks = [group * 1000 + i for i in range(length)]
    if tail is not None and blocks:
        blocks[-1] = tail
    return tuple(blocks)


def pick_on_loads(policy: Policy, loads: dict[str, int], hashes: tuple[int, ...]) -> Decision:
    """``policy``'s pick for a headerless request of ``hashes`` on workers with ``loads``
    requests in flight (a table row: worker id -> in flight)."""
    snapshot = fleet(*(worker(w, in_flight=n) for w, n in loads.items()))
    return policy.pick(request(hashes=hashes), ctx(snapshot))


def place_concurrently(
    policy: Policy,
    workers: int,
    opening: int,
    tails: list[int],
    work: dict[str, int] | None = None,
) -> dict[str, int]:
    """Route headerless requests sharing an ``opening``-block opening, none finishing.

    Requests per worker; ``work``, when given, gets each worker's own-tail blocks.
    """
    fleet_workers = [worker(f"w{i}") for i in range(workers)]
    loads = dict.fromkeys((w.id for w in fleet_workers), 0)
    for n, tail in enumerate(tails):
        snapshot = fleet(*(replace(w, in_flight=loads[w.id]) for w in fleet_workers))
        hashes = (*chain(1, opening), *(10_000 * (n + 1) + i for i in range(tail)))
        decision = policy.pick(request(f"r{n}", hashes=hashes), ctx(snapshot))
        assert decision.worker is not None and decision.affinity is None
        policy.on_routed(request(f"r{n}", hashes=hashes), decision.worker, 0.0)
        loads[decision.worker] += 1
        if work is not None:
            work[decision.worker] = work.get(decision.worker, 0) + tail
    return loads
