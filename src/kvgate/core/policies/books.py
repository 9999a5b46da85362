"""The default policy's bookkeeping: each worker's queue estimate, and conversation lives.

Plain mutable records the policy updates on every placement and report; kept apart
from the decision so ``core.policies.default`` reads as the cost model it is.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from kvgate.core.policies.running import RunningBlocks
from kvgate.core.speed import FleetSpeed, Speed
from kvgate.types import BlockHash, Seconds, WorkerId

_Flight = tuple[WorkerId, float, Seconds, tuple[BlockHash, ...]]
Cost = tuple[float, float, float, float, float, float, float, float, float, float, float]
"""What a decision reads of a worker: its queue (backlog tokens, as of when, tokens owed),
its fill, and its learned speed: prefill seconds a token, that over the prior's (its
*pace*: a cost's prefill terms are in the prior's seconds), overhead and decode seconds;
then, so that a decision computes the queue only where it has to: until when the queue
is surely at what is owed (``_left``), those seconds, after when it is surely drained,
and ``1 - fill``."""

_MARGIN = 1e-9
"""How far past the float rounding of ``_left``'s terms a ``Cost``'s bounds on its
queue lie (relative, and in seconds a second of the clock)."""


class Book:
    """What the policy keeps per worker: its prefill queue estimate, cache fill, recent count.

    One object a worker, so a decision costs one dictionary probe per worker.
    """

    __slots__ = ("as_of", "backlog", "charged", "fill", "owed", "recent", "recent_at", "room",
                 "sent", "sent_at")  # fmt: skip

    def __init__(self, now: Seconds) -> None:
        self.backlog = 0.0
        """Prefill tokens queued there as of ``as_of``: drained at the worker's learned rate."""
        self.as_of = now
        self.owed = 0.0
        """Prefill tokens of the requests routed there and not yet reported back."""
        self.fill = 0.0
        """How full its share of the prefix index is (``PrefixIndex.fill``)."""
        self.room = 0.0
        """Its KV capacity in tokens, as the index believes it (``PrefixIndex.kv_blocks``)."""
        self.sent = 0.0
        """Uncached tokens routed there, halved every ``Queues.recent_half_s`` (as of
        ``sent_at``)."""
        self.sent_at = now
        self.charged = 0.0
        """The fill a placement is charged: ``fill``, at most what was sent lately fills."""
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

    Each routed request adds its uncached prefill tokens to its worker's queue, which
    drains at the worker's learned prefill rate (``FleetSpeed.speed``, where ``learned``;
    else at the prior's: the engines' own rate where they report one, else the configured
    rate) and is never more than the tokens of the
    requests still in flight there (``owed``), so a wrong rate cannot make it drift. A
    request never reported back is dropped after ``horizon_s``, or when more than
    ``max_pending`` are in flight.

    A worker's fill is charged at most what it was sent lately fills of its cache (the
    uncached tokens routed there, halved every ``recent_half_s``; ``age``): the index
    forgets only as new blocks push old ones out, so a worker sent nothing kept its fill
    for good, paying for evicting a cache nobody had asked for in minutes. With
    ``learned``, a worker the policy stopped sending to (slowed, fitted slow) stayed so:
    on uniform-mixed-slowdown it got 0.02-0.04 of the requests for its 0.195.
    """

    __slots__ = ("_aged_at", "_flights", "books", "costs", "horizon_s", "idle", "learned",
                 "max_pending", "prior_s", "recent_half_s", "running", "speed")  # fmt: skip

    def __init__(
        self,
        speed: FleetSpeed,
        recent_half_s: Seconds,
        horizon_s: Seconds,
        max_pending: int,
        *,
        learned: bool = True,
    ) -> None:
        self.speed = speed
        self.learned = learned
        """Whether a worker's queue and costs are at its learned speed (else the prior's)."""
        self.prior_s = speed.prior.prefill_s
        """The prior's prefill seconds a token: the unit of a cost's prefill terms."""
        self.recent_half_s = recent_half_s
        self.horizon_s = horizon_s
        self.max_pending = max_pending
        self.books: dict[WorkerId, Book] = {}
        self.costs: dict[WorkerId, Cost] = {}
        """What a decision reads of each book, as one tuple (``Cost``): replaced whenever
        the book or the worker's learned speed changes, so the hot loop unpacks instead of
        probing."""
        self.idle: Cost = self._cost(0.0, 0.0, 0.0, 0.0, self._speed(None))
        """The ``Cost`` of a worker with no book: nothing queued, the fleet's speed."""
        self.running = RunningBlocks()
        """The chains of the requests in flight, per worker."""
        # Requests routed and not reported back: worker, prefill tokens, when routed,
        # and their chains (counted in ``running`` while they are in flight).
        self._flights: OrderedDict[str, _Flight] = OrderedDict()
        self._aged_at = -math.inf  # when the books were last charged their fill (``age``)

    def queued_tokens(self, worker: WorkerId, now: Seconds) -> float:
        """The prefill tokens ``worker`` is estimated to still have queued at ``now``."""
        book = self.books.get(worker)
        if book is None:
            return 0.0
        return _left(book.backlog, book.as_of, book.owed, self._speed(worker).prefill_s, now)

    def repace(self) -> None:
        """The learned speeds moved (an observation): every worker's ``Cost`` is read again."""
        self.idle = self._cost(0.0, 0.0, 0.0, 0.0, self._speed(None))
        for worker, book in self.books.items():
            self._publish(worker, book)

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
        tokens: float,
        hashes: tuple[BlockHash, ...],
        now: Seconds,
    ) -> None:
        """Queue ``tokens`` of prefill on ``worker`` for a request with chain ``hashes``."""
        book = self.books.get(worker)
        if book is None:
            book = self.books[worker] = Book(now)
        recent = self.recent(worker, now)
        queued = self.queued_tokens(worker, now)
        book.backlog, book.as_of = queued + tokens, now
        book.owed += tokens
        book.recent, book.recent_at = recent + 1.0, now
        book.sent, book.sent_at = self._sent(book, now) + tokens, now
        flights = self._flights
        old = flights.pop(request_id, None)
        if old is not None:
            self._settle(old)
        flights[request_id] = (worker, tokens, now, hashes)
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

    def refill(self, worker: WorkerId, fill: float, room: float, now: Seconds) -> None:
        """How full ``worker``'s share of the prefix index is now (``PrefixIndex.fill``),
        of a KV cache of ``room`` tokens."""
        book = self.books.get(worker)
        if book is not None:
            book.fill, book.room = fill, room
            self._charge(book, now)
            self._publish(worker, book)

    def age(self, now: Seconds) -> None:
        """Let each worker's charged fill decay with what it was sent lately: every
        ``recent_half_s / 16``, every book is charged again as of ``now``."""
        if now < self._aged_at + self.recent_half_s / 16.0:
            return
        self._aged_at = now
        for worker, book in self.books.items():
            if self._charge(book, now):
                self._publish(worker, book)

    def _sent(self, book: Book, now: Seconds) -> float:
        """``book.sent`` as of ``now``."""
        age = now - book.sent_at
        return book.sent * math.exp2(-age / self.recent_half_s) if age > 0.0 else book.sent

    def _charge(self, book: Book, now: Seconds) -> bool:
        """Charge ``book`` its fill as of ``now``; whether that moved it."""
        fill = book.fill
        if book.room > 0.0:
            lately = self._sent(book, now) / book.room
            fill = lately if lately < fill else fill
        moved = fill != book.charged
        book.charged = fill
        return moved

    def forget(self, worker: WorkerId) -> None:
        """The worker left the fleet."""
        self.books.pop(worker, None)
        self.costs.pop(worker, None)
        self.running.forget(worker)

    def _publish(self, worker: WorkerId, book: Book) -> None:
        speed = self._speed(worker)
        self.costs[worker] = self._cost(book.backlog, book.as_of, book.owed, book.charged, speed)

    def _speed(self, worker: WorkerId | None) -> Speed:
        """``worker``'s learned speed (``None``: the fleet's), or if not ``learned`` its
        prior: at the engines' own prefill rate where they report one (llama.cpp:
        ``FleetSpeed.prior_of``)."""
        speed = self.speed
        if not self.learned:
            return speed.prior_of(worker)
        return speed.speed(worker) if worker is not None else speed.fleet()

    def _cost(self, backlog: float, as_of: float, owed: float, fill: float, speed: Speed) -> Cost:
        per_token = speed.prefill_s
        pace = per_token / self.prior_s
        # ``_left`` is ``owed`` before ``full``, 0 after ``drained``: a decision computes it
        # between them alone (the same operations, so the same cost to the last bit).
        slack = _MARGIN * (abs(as_of) + 1.0)
        full = as_of + (backlog - owed) * per_token * (1.0 - _MARGIN) - slack
        drained = as_of + backlog * per_token * (1.0 + _MARGIN) + slack
        return (backlog, as_of, owed, fill, per_token, pace, speed.overhead_s, speed.decode_s,
                full, drained, 1.0 - fill)  # fmt: skip

    def _settle(self, flight: _Flight) -> None:
        worker, tokens, _, hashes = flight
        self.running.remove(worker, hashes)
        book = self.books.get(worker)
        if book is not None:
            left = book.owed - tokens
            book.owed = left if left > 1e-9 else 0.0
            self._publish(worker, book)


def _left(backlog: float, as_of: float, owed: float, prefill_s: float, now: Seconds) -> float:
    """Tokens of ``backlog`` (as of ``as_of``) still to prefill at ``now`` at ``prefill_s``
    seconds a token, at most ``owed``."""
    left = backlog - (now - as_of) / prefill_s
    return 0.0 if left <= 0.0 else left if left < owed else owed
