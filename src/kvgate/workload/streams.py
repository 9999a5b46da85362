"""Building blocks of synthetic workloads: sizes, Zipf ranks, session interleaving.

A workload is a generator over ``SimRequest`` in arrival order; these are the
pieces every generator shares: fresh segment ids, sizes with a known mean, a
Zipf sampler, and the two stream shapes (interleaved multi-turn sessions, and
independent single-turn requests). Memory is bounded by the sessions open at
one instant, never by how many requests were produced.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvgate.types import Seconds
from kvgate.workload.arrivals import ArrivalSpec
from kvgate.workload.request import Segment, SimRequest


class ZipfSampler:
    """Draws ranks ``0..n-1`` with probability proportional to ``1 / (rank+1)**s``."""

    def __init__(self, n: int, s: float) -> None:
        if n <= 0:
            raise ValueError("a Zipf sampler needs at least one item")
        weights = [1.0 / (rank + 1) ** s for rank in range(n)]
        self._cumulative = list(itertools.accumulate(weights))
        self._total = self._cumulative[-1]

    def sample(self, rng: random.Random) -> int:
        """One rank."""
        return min(
            bisect.bisect_right(self._cumulative, rng.random() * self._total),
            len(self._cumulative) - 1,
        )

    def distinct(self, rng: random.Random, k: int) -> list[int]:
        """``k`` different ranks (fewer if there are fewer items), in draw order."""
        k = min(k, len(self._cumulative))
        picked: list[int] = []
        while len(picked) < k:
            rank = self.sample(rng)
            if rank not in picked:
                picked.append(rank)
        return picked


def around(rng: random.Random, mean: int) -> int:
    """A positive size uniform on ``[mean/2, 3*mean/2]``: variety with a known mean."""
    if mean <= 1:
        return 1
    return max(1, rng.randint(mean // 2, mean + mean // 2))


def turns(rng: random.Random, mean: float, cap: int) -> int:
    """A geometric number of turns (at least one) with the given mean, capped."""
    if mean <= 1:
        return 1
    p = 1.0 / mean
    n = 1
    while n < cap and rng.random() > p:
        n += 1
    return n


class Ids:
    """Fresh segment ids; one counter per workload run so a seed fixes them all."""

    def __init__(self, reserved: int) -> None:
        self._next = reserved  # ids below are fixed content (system prompts, documents)

    def take(self, n: int = 1) -> int:
        """The first of ``n`` consecutive unused ids."""
        first = self._next
        self._next += n
        return first


@dataclass(slots=True)
class Session:
    """One conversation being generated: its key, its context so far, turns left."""

    key: str
    context: list[Segment]
    turns_left: int
    turn: int = 0


TurnFn = Callable[[random.Random, Ids, Session], tuple[list[Segment], int]]
"""Builds one turn: the new segments appended to the context, and max_tokens."""

OpenFn = Callable[[random.Random, Ids, str], Session]
"""Opens a session under a key: its opening context and number of turns."""


def session_stream(
    name: str,
    seed: int,
    arrival: ArrivalSpec,
    *,
    turns_mean: float,
    think_s: Seconds,
    open_session: OpenFn,
    next_turn: TurnFn,
    session_ids: bool,
    reserved: int,
    opening: int,
    replies: bool = True,
    population: int = 0,
) -> Iterator[SimRequest]:
    """Interleave sessions in time order: each turn re-sends the whole context.

    Sessions start at ``arrival.rate / turns_mean`` (so requests come at about
    ``arrival.rate``), unless ``population`` > 0: then that many sessions are open
    at every instant (a closed population, as a benchmark's "N concurrent
    sessions"), the first ones starting within one think time and each finished
    session replaced by a new one a think time later. With ``replies`` False a
    turn's output is not re-sent (a trace of prompt blocks only records input).
    """
    rng = random.Random(f"{name}:{seed}")
    ids = Ids(reserved)
    arrivals = random.Random(f"{name}:{seed}:arrivals")
    starts: Iterator[Seconds] = (
        itertools.repeat(math.inf)
        if population > 0
        else arrival.times(arrivals, arrival.rate / turns_mean)
    )
    pending: list[tuple[Seconds, int, Session]] = []
    order = itertools.count()
    n_sessions = 0
    n_requests = 0

    def think() -> Seconds:
        return rng.expovariate(1.0 / think_s) if think_s > 0 else 0.0

    for _ in range(population):
        at = arrivals.uniform(0.0, think_s) if think_s > 0 else 0.0
        heapq.heappush(pending, (at, next(order), open_session(rng, ids, f"s{n_sessions}")))
        n_sessions += 1
    next_start = next(starts)
    while True:
        if pending and pending[0][0] <= next_start:
            at, _, session = heapq.heappop(pending)
            new, max_tokens = next_turn(rng, ids, session)
            session.context.extend(new)
            session.turn += 1
            session.turns_left -= 1
            # The reply becomes context of the next turn; its length is the
            # max_tokens the engine will generate.
            more = session.turns_left > 0
            reply = (ids.take(), max_tokens) if more and replies else None
            yield SimRequest.of(
                arrival=at,
                request_id=f"r{n_requests}",
                segments=tuple(session.context),
                max_tokens=max_tokens,
                session_id=session.key if session_ids else None,
                opening=opening,
                reply=reply,
                conversation=session.key,
            )
            n_requests += 1
            if reply is not None:
                session.context.append(reply)
            if more:
                heapq.heappush(pending, (at + think(), next(order), session))
            elif population > 0:
                fresh = open_session(rng, ids, f"s{n_sessions}")
                n_sessions += 1
                heapq.heappush(pending, (at + think(), next(order), fresh))
        elif next_start == math.inf:
            return  # a closed population of zero sessions
        else:
            session = open_session(rng, ids, f"s{n_sessions}")
            n_sessions += 1
            heapq.heappush(pending, (next_start, next(order), session))
            next_start = next(starts)


def single_turn_stream(
    name: str,
    seed: int,
    arrival: ArrivalSpec,
    build: Callable[[random.Random, Ids], tuple[list[Segment], int]],
    reserved: int,
) -> Iterator[SimRequest]:
    """Independent chat requests (system message, one user message) at arrival instants."""
    rng = random.Random(f"{name}:{seed}")
    ids = Ids(reserved)
    for n, at in enumerate(arrival.times(random.Random(f"{name}:{seed}:arrivals"))):
        segments, max_tokens = build(rng, ids)
        yield SimRequest.of(at, f"r{n}", tuple(segments), max_tokens, opening=len(segments))
