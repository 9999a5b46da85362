"""What prefill done twice costs the requests behind it: the default policy's waste term.

Placing a request away from the worker that holds its prefix recomputes that prefix.
``default``'s expected TTFT counts the recompute for the request itself only, so on a
backlogged fleet it moved a request whenever the warm worker's queue was a little
longer than the recompute. But the recompute is capacity taken from every request
that queues behind it: while each worker has a queue (the shortest one, ``backlog``
seconds), about ``rate × backlog`` requests arrive before the fleet is idle again,
and the extra work, spread over the fleet's ``n`` workers, delays each of them by
``1/n`` of it. On SGLang's generated-shared-prefix shape (groups of one-shot
questions behind a long system prompt, all sent at once) that cost both hit rate
(each move recomputes a system prompt: 1-5 of 128 requests a run) and TTFT p99.

So a worker's cost carries ``waste × (held − cached)`` prefill seconds, where
``held`` is what the best-matching candidate is expected to hold (its resident
cache, and of a claim past that the share usage confirms, as the TTFT terms count
it) and ``cached`` the worker's own match. The factor ``waste`` is:

- ``rate × backlog / n``, capped (a burst's rate says more about the burst than
  about how many it will delay);
- over the requests a conversation makes (``turns``: requests routed over
  conversations opened): a move relieves the warm worker of the conversation's
  later turns too, so for multi-turn traffic the recompute buys more than one
  request's TTFT. One-shot traffic opens with every request and pays in full;
- faded as the holder's pull is, by its queue and by how full its cache is: a
  cache-rich but busy or full worker is still left when its queue grows.

``Pace`` is the arrival rate: the mean gap between the last ``span`` arrivals,
counted in arrivals rather than seconds so a burst shows at once, and a quiet
spell lowers it as it lasts (the gap since the last arrival counts).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kvgate.core.fleet import WorkerState
from kvgate.core.policies.books import Life
from kvgate.types import Seconds


class Pace:
    """Requests a second lately (see the module docs)."""

    __slots__ = ("at", "gap", "span")

    def __init__(self, span: int = 16) -> None:
        self.span = span
        self.gap = -1.0  # no gap seen yet
        self.at: Seconds | None = None

    def note(self, now: Seconds) -> None:
        """One more request arrived at ``now``."""
        at = self.at
        if at is not None:
            gap = max(0.0, now - at)
            self.gap = gap if self.gap < 0.0 else self.gap + (gap - self.gap) / self.span
        self.at = now

    def rate(self, now: Seconds) -> float:
        """Arrivals a second (0 before two arrivals)."""
        at = self.at
        if at is None or self.gap < 0.0:
            return 0.0
        return 1.0 / max(self.gap, now - at, 1e-9)


def queued_s(entry: tuple[float, float, float] | None, now: Seconds) -> Seconds:
    """A worker's estimated prefill queue at ``now`` from its (busy_until, owed_s, fill)."""
    return max(0.0, min(entry[0] - now, entry[1])) if entry is not None else 0.0


class Waste:
    """The waste factor's inputs, kept as requests are routed (see the module docs)."""

    __slots__ = ("cap", "half_s", "pace", "turns")

    def __init__(self, cap: float, half_s: Seconds) -> None:
        self.cap = cap
        self.half_s = half_s
        self.pace = Pace()
        self.turns = Life()
        """Requests routed over conversations opened (``Life.mean``: turns a conversation)."""

    def factor(self, now: Seconds, backlog: Seconds, workers: int) -> float:
        """Seconds of delay to others per second of prefix recomputed, before the fade:
        ``backlog`` is the shortest queue among ``workers`` candidates (0: one is idle,
        its capacity is free, and nothing is charged)."""
        if backlog <= 0.0 or workers <= 0:
            return 0.0
        factor = min(self.cap, self.pace.rate(now) * backlog / workers)
        return factor / max(1.0, self.turns.mean())

    def fade(self, now: Seconds, entry: tuple[float, float, float] | None) -> float:
        """The holder's pull fades (room left in its cache, over its queue), from its
        (busy_until, owed_s, fill)."""
        if entry is None:
            return 1.0
        return (1.0 - entry[2]) / (1.0 + queued_s(entry, now) / self.half_s)


def rescore(
    scored: list[tuple[float, WorkerState]],
    cached: Callable[[WorkerState], float],
    held: float,
    waste: float,
    tie: Callable[[WorkerState], tuple[int, float, float, str]],
) -> WorkerState:
    """The cheapest of ``scored`` once each worker holding less than ``held`` (characters
    of the best holder's likely cache) is charged ``waste`` seconds a character short;
    ``scored`` is updated in place, exact ties go to the lower ``tie``."""
    best, best_cost = scored[0][1], math.inf
    for i, (plain, w) in enumerate(scored):
        have, cost = cached(w), plain
        if held > have:
            cost = plain + waste * (held - have)
            scored[i] = (cost, w)
        if cost < best_cost or (cost == best_cost and tie(w) < tie(best)):
            best, best_cost = w, cost
    return best
