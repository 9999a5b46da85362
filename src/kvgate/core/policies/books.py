"""The default policy's bookkeeping: each worker's queue estimate, and conversation lives."""

from __future__ import annotations

import math
from collections import OrderedDict

from kvgate.core.policies.running import RunningBlocks
from kvgate.core.speed import FleetSpeed, Speed
from kvgate.types import BlockHash, Seconds, WorkerId

_Flight = tuple[WorkerId, float, Seconds, tuple[BlockHash, ...]]
Cost = tuple[float, float, float, float, float, float, float, float, float]
"""What a decision reads of a worker, each term as the cost takes it: when its queue drains
and the most it owes (seconds), prefill seconds a token, its fill, its *pace* (that over
the prior's), overhead and decode seconds; its fill at the fleet's pace (an eviction costs
the later requests that, wherever they go) and ``1 - fill`` at its own (a cache's pull)."""


class Book:
    """What the policy keeps per worker (one object a worker: one probe a decision)."""

    __slots__ = ("as_of", "backlog", "charged", "fill", "owed", "recent", "room", "sent",
                 "sent_at")  # fmt: skip

    def __init__(self, now: Seconds) -> None:
        self.backlog, self.as_of = 0.0, now  # prefill tokens queued there as of ``as_of``
        self.owed = 0.0  # prefill tokens of the requests there not yet reported back
        self.fill = 0.0  # how full its share of the index is (``PrefixIndex.fill``)
        self.room = 0.0  # its KV capacity in tokens, as the index believes it
        self.charged = 0.0  # the fill a placement is charged: at most what ``sent`` fills
        # Uncached tokens and requests routed there, halved every ``recent_half_s``.
        self.sent, self.recent, self.sent_at = 0.0, 0.0, now


class Life:
    """Prefill seconds routed over conversations opened (both halved every ``half_s``)."""

    __slots__ = ("at", "opened", "seconds")

    def __init__(self) -> None:
        self.seconds, self.opened, self.at = 0.0, 0.0, 0.0

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
    drains at the prior's rate (``FleetSpeed.prior_of``: the engines' own where they
    report one) and is never more than the tokens of the requests still in flight there
    (``owed``), so a wrong rate cannot make it drift. A request never reported back is
    dropped after ``horizon_s``, or when more than ``max_pending`` are in flight. A
    worker's fill is charged at most what it was sent lately fills of its cache (the
    uncached tokens routed there, halved every ``recent_half_s``; ``age``).
    """

    __slots__ = ("_aged_at", "_flights", "books", "costs", "horizon_s", "idle", "max_pending",
                 "prior_s", "recent_half_s", "running", "speed")  # fmt: skip

    def __init__(
        self, speed: FleetSpeed, recent_half_s: Seconds, horizon_s: Seconds, max_pending: int
    ) -> None:
        self.speed = speed
        self.prior_s = speed.prior.prefill_s  # the unit of a cost's prefill terms
        self.recent_half_s, self.horizon_s, self.max_pending = recent_half_s, horizon_s, max_pending
        self.books: dict[WorkerId, Book] = {}
        # Each book as a decision reads it, replaced whenever it or the prior changes.
        self.costs: dict[WorkerId, Cost] = {}
        self.idle: Cost = self._idle()  # no book
        self.running = RunningBlocks()  # the chains of the requests in flight, per worker
        # Requests not reported back: worker, prefill tokens, when routed, their chain.
        self._flights: OrderedDict[str, _Flight] = OrderedDict()
        self._aged_at = -math.inf  # when the books were last charged their fill (``age``)

    def queued_tokens(self, worker: WorkerId, now: Seconds) -> float:
        """The prefill tokens ``worker`` is estimated to still have queued at ``now``."""
        book = self.books.get(worker)
        if book is None:
            return 0.0
        return _left(
            book.backlog, book.as_of, book.owed, self.speed.prior_of(worker).prefill_s, now
        )

    def repace(self) -> None:
        """The prior moved (an engine's own rate): every worker's ``Cost`` is read again."""
        self.idle = self._idle()
        for worker, book in self.books.items():
            self._publish(worker, book)

    def recent(self, worker: WorkerId, now: Seconds) -> float:
        """Requests routed to ``worker`` lately, halved every ``recent_half_s``."""
        book = self.books.get(worker)
        if book is None:
            return 0.0
        age = now - book.sent_at
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
        book.recent, book.sent, book.sent_at = recent + 1.0, self._sent(book, now) + tokens, now
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
        self.costs[worker] = self._cost(book, self.speed.prior_of(worker), self.idle[4])

    def _idle(self) -> Cost:
        speed = self.speed.prior_of(None)
        return self._cost(None, speed, speed.prefill_s / self.prior_s)

    def _cost(self, book: Book | None, speed: Speed, fleet: float) -> Cost:
        """``book`` (``None``: nothing queued) at ``speed``, evicting at pace ``fleet``."""
        backlog, as_of, owed, fill = (
            (0.0, 0.0, 0.0, 0.0)
            if book is None
            else (book.backlog, book.as_of, book.owed, book.charged)
        )
        per_token = speed.prefill_s
        pace = per_token / self.prior_s
        return (as_of + backlog * per_token, owed * per_token, per_token, fill, pace,
                speed.overhead_s, speed.decode_s, fill * fleet, pace * (1.0 - fill))  # fmt: skip

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


class Conversations:
    """What a headerless conversation routes over its life, measured as it goes: the
    prefill of an opening turn, that of a later turn, and how many turns one has (a turn
    is *continued* when a later one runs through its end, ``ChainEnds.through``, and
    *final* once none has for ``idle_gaps`` mean gaps), each halved every ``half_s``
    (``docs/dev/default.md``)."""

    __slots__ = ("_continued", "_final", "_gap", "_later", "_opening", "_pending", "half_s",
                 "idle_gaps", "max_pending")  # fmt: skip

    def __init__(self, half_s: Seconds, max_pending: int = 65_536, idle_gaps: float = 4.0) -> None:
        self.half_s = half_s
        self.idle_gaps = idle_gaps
        self.max_pending = max_pending
        self._opening = Life()  # prefill seconds an opening turn routes, per opening
        self._later = Life()  # prefill seconds a later turn routes, per later turn
        self._continued = Life()  # turns continued, per turn resolved
        self._gap = Life()  # seconds from a turn to the next, per continuation
        # Turns not yet continued, oldest first: request id -> when routed.
        self._pending: OrderedDict[str, Seconds] = OrderedDict()
        # Turns judged final, oldest first: request id -> when routed.
        self._final: OrderedDict[str, Seconds] = OrderedDict()

    def routed(self, request_id: str, now: Seconds, seconds: float, extends: str | None) -> None:
        """A headerless request was routed with ``seconds`` of prefill: an opening
        (``extends`` None) or the next turn of the request ``extends`` names."""
        half, pending = self.half_s, self._pending
        if extends is None:
            self._opening.add(now, half, seconds, 1.0)
        else:
            self._later.add(now, half, seconds, 1.0)
            at = pending.pop(extends, None)
            late = self._final.pop(extends, None) if at is None else None
            if at is not None or late is not None:  # a late one was judged final: undone
                self._continued.add(now, half, 1.0, 0.0 if at is None else 1.0)
                self._gap.add(now, half, now - (at if at is not None else late or 0.0), 1.0)
        pending.pop(request_id, None)
        pending[request_id] = now
        gap = self._gap.mean()
        idle = now - self.idle_gaps * gap if gap > 0.0 else None
        while pending:
            first = next(iter(pending.values()))
            old = idle is not None and first < idle
            if not old and len(pending) <= self.max_pending:
                break
            rid, at = pending.popitem(last=False)
            if old:  # a final turn (one only forgotten, for room, is no evidence)
                self._continued.add(now, half, 0.0, 1.0)
                final = self._final
                final[rid] = at
                if len(final) > self.max_pending:
                    final.popitem(last=False)

    def turns(self) -> float:
        """Turns a conversation has, on average (1: one-shot traffic, or nothing seen yet)."""
        life = self._continued
        continued = life.seconds
        return 1.0 + continued / (life.opened - continued + 1.0)

    def life_s(self) -> float:
        """Prefill seconds a conversation routes over its life (0: nothing routed yet)."""
        return self._opening.mean() + (self.turns() - 1.0) * self._later.mean()
