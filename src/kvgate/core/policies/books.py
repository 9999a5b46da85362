"""The default policy's bookkeeping: each worker's queue estimate, and conversation lives.

Plain mutable records the policy updates on every placement and report; kept apart
from the decision so ``core.policies.default`` reads as the cost model it is.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from kvgate.core.policies.running import RunningBlocks
from kvgate.types import BlockHash, Seconds, WorkerId

_Flight = tuple[WorkerId, float, Seconds, tuple[BlockHash, ...]]


class Book:
    """What the policy keeps per worker: its prefill queue estimate, cache fill, recent count.

    One object a worker, so a decision costs one dictionary probe per worker.
    """

    __slots__ = ("busy_until", "fill", "owed_s", "recent", "recent_at")

    def __init__(self, now: Seconds) -> None:
        self.busy_until = now
        """When the prefill queued there is done, at the configured rate (virtual time)."""
        self.owed_s = 0.0
        """Prefill seconds of the requests routed there and not yet reported back."""
        self.fill = 0.0
        """How full its share of the prefix index is (``PrefixIndex.fill``)."""
        self.recent = 0.0
        self.recent_at = now


class Life:
    """What a conversation routes over its life, on average: prefill seconds over openings.

    Both counts are halved every ``half_s`` (together, so only their ratio matters).
    """

    __slots__ = ("at", "opened", "seconds")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.opened = 0.0
        self.at: Seconds = 0.0

    def add(self, now: Seconds, half_s: float, seconds: float, opened: float) -> None:
        age = now - self.at
        if age > 0.0:
            decay = math.exp2(-age / half_s)
            self.seconds *= decay
            self.opened *= decay
            self.at = now
        self.seconds += seconds
        self.opened += opened

    def mean(self) -> float:
        return self.seconds / self.opened if self.opened >= 1e-9 else 0.0


class Queues:
    """Each worker's prefill queue estimate, from the requests routed and not reported.

    Each routed request adds its prefill seconds to its worker's queue, which drains
    at the configured rate and is never more than the prefill of the requests still
    in flight there (``owed_s``), so a wrong rate cannot make it drift. A request
    never reported back is dropped after ``horizon_s``, or when more than
    ``max_pending`` are in flight.
    """

    __slots__ = ("_flights", "books", "costs", "horizon_s", "max_pending", "rate",
                 "recent_half_s", "running")  # fmt: skip

    def __init__(
        self, rate: float, recent_half_s: Seconds, horizon_s: Seconds, max_pending: int
    ) -> None:
        self.rate = rate
        self.recent_half_s = recent_half_s
        self.horizon_s = horizon_s
        self.max_pending = max_pending
        self.books: dict[WorkerId, Book] = {}
        self.costs: dict[WorkerId, tuple[float, float, float]] = {}
        """What a decision reads of each book, as one tuple (busy_until, owed_s, fill):
        replaced whenever the book changes, so the hot loop unpacks instead of probing."""
        self.running = RunningBlocks()
        """The chains of the requests in flight, per worker."""
        # Requests routed and not reported back: worker, prefill seconds, when routed,
        # and their chains (counted in ``running`` while they are in flight).
        self._flights: OrderedDict[str, _Flight] = OrderedDict()

    def queued_tokens(self, worker: WorkerId, now: Seconds) -> float:
        """The prefill tokens ``worker`` is estimated to still have queued at ``now``."""
        book = self.books.get(worker)
        if book is None:
            return 0.0
        return min(max(0.0, book.busy_until - now), book.owed_s) * self.rate

    def recent(self, worker: WorkerId, now: Seconds) -> float:
        """Requests routed to ``worker`` lately, halved every ``recent_half_s``."""
        book = self.books.get(worker)
        if book is None:
            return 0.0
        age = now - book.recent_at
        age = age if age > 0.0 else 0.0  # not ``max``: keyword parsing on 3.11, per request
        return book.recent * math.exp2(-age / self.recent_half_s)

    def routed(
        self,
        request_id: str,
        worker: WorkerId,
        seconds: float,
        hashes: tuple[BlockHash, ...],
        now: Seconds,
    ) -> None:
        """Queue ``seconds`` of prefill on ``worker`` for a request with chain ``hashes``."""
        book = self.books.get(worker)
        if book is None:
            book = self.books[worker] = Book(now)
        recent = self.recent(worker, now)
        busy = book.busy_until
        book.busy_until = (now if now > busy else busy) + seconds
        book.owed_s += seconds
        book.recent, book.recent_at = recent + 1.0, now
        flights = self._flights
        old = flights.pop(request_id, None)
        if old is not None:
            self._settle(old)
        flights[request_id] = (worker, seconds, now, hashes)
        self.running.add(worker, hashes)
        horizon = now - self.horizon_s
        while flights:
            first = next(iter(flights.values()))
            if first[2] >= horizon and len(flights) <= self.max_pending:
                break
            self._settle(flights.popitem(last=False)[1])
        self._publish(worker, book)

    def reported(self, request_id: str) -> None:
        """The request is done: its prefill leaves its worker's queue bound."""
        flight = self._flights.pop(request_id, None)
        if flight is not None:
            self._settle(flight)

    def refill(self, worker: WorkerId, fill: float) -> None:
        """How full ``worker``'s share of the prefix index is now (``PrefixIndex.fill``)."""
        book = self.books.get(worker)
        if book is not None:
            book.fill = fill
            self._publish(worker, book)

    def forget(self, worker: WorkerId) -> None:
        """The worker left the fleet."""
        self.books.pop(worker, None)
        self.costs.pop(worker, None)
        self.running.forget(worker)

    def _publish(self, worker: WorkerId, book: Book) -> None:
        self.costs[worker] = (book.busy_until, book.owed_s, book.fill)

    def _settle(self, flight: _Flight) -> None:
        worker, seconds, _, hashes = flight
        self.running.remove(worker, hashes)
        book = self.books.get(worker)
        if book is not None:
            left = book.owed_s - seconds
            book.owed_s = left if left > 1e-9 else 0.0
            self._publish(worker, book)
