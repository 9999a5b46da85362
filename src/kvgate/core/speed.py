"""Each worker's speed, learned from what the gateway observes of its requests.

A worker's time to first token for a request sent at ``t`` is modelled as::

    ttft = overhead + prefill × (uncached tokens queued ahead + this request's uncached)
                    + decode × requests decoding there

``overhead`` (seconds), ``prefill`` (seconds per uncached token) and ``decode`` (seconds
each running request adds: its decode steps interleave with the prefill) are fitted per
worker by recursive least squares with forgetting (``forgetting``: the weight of an
observation halves after ~0.7 / (1 - forgetting) newer ones), on relative errors (each
observation weighted by 1 / its predicted TTFT, since TTFTs span orders of magnitude), with
outliers clipped to ``clip`` times the running error scale (Huber): a stall of one request
cannot drag the estimate, a worker that slows down moves it within a few dozen requests.

What is queued ahead is this model's own book of the requests sent (``sent``): the uncached
tokens of those sent earlier to the same worker and not yet at their first token, less what
the worker has prefilled of them since: the engine works through its queue as it comes
(chunked prefill: the head of the queue is part done when the next request arrives), so the
book drains at the worker's learned prefill rate from each send, and starts over from what
is still unstarted at each first token (everything sent before it is done, in order). Their
uncached tokens are the caller's guess at send time and the truth from ``usage`` once they
end. Where the engine reports its own queue (``waiting``, ``running`` from a scrape), the
others' work it shows (another replica's) adds to this replica's exact book: ``predict``.
A policy that costs at the prior (``default``) has the book drain at the prior's rate
(``at_prior``; the fit drains it again at the rate learned: ``_features``). The book also
counts the requests and uncached tokens sent to each worker lately (``lately``).

An engine that reports its batch slots (llama.cpp's ``/slots``: ``engine``) is no queue
(``core.batch``): the fit sees the tokens a request's prefill shared the batch with, and
its TTFT less its wait for a slot (the book's, with the decoding time measured: ``held``).

Starts from a prior (the profile or config; before any observation, the engines' own
measure of their prefill where they report it: ``engine``); a worker seen fewer than
``warm`` times is predicted with the fleet's estimate (the median of the warm workers'
parameters, or while none is warm of those seen at all). A prior off by more than twice is
rescaled at a worker's first observations (a CPU engine against a GPU profile: the fit's
relative steps would take hundreds of requests to cross a factor of a hundred). A streamed
request ``_LATE`` times past its predicted TTFT without a first token is a lower bound on it,
fitted then (``late``): a worker far slower than believed is known in seconds, not at its
first answer. Where queueing the features miss dominates the TTFTs, the fit is held to what
they can show: the overhead never above their low decile, the prefill rate within ``band``
of its start, none below nought (one held at a bound moves the others as the fit's
covariance ties them to it: ``speed_fit._bound``); and a worker long without observations
drifts back to the fleet's estimate (``stale``), to be tried again. Pure: no clock (times
are passed in), no I/O.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import replace

from kvgate.core.batch import shared_prefill
from kvgate.core.fleet import WorkerState
from kvgate.core.speed_book import IDLE_BOOK, Book, Look, Sent, context
from kvgate.core.speed_book import ended as context_ended
from kvgate.core.speed_fit import (
    SCALE,
    Fit,
    N,
    Observation,
    Speed,
    SpeedReport,
    speed_of,
    spread,
    theta_of,
)
from kvgate.types import Seconds, WorkerId

__all__ = ["IDLE_BOOK", "Book", "FleetSpeed", "Look", "Observation", "Speed", "SpeedReport"]

# A streamed request this many times past its predicted TTFT is late (``late``): only a
# worker grossly slower than believed (a CPU engine behind a GPU prior: 100x) is caught, in
# seconds. Lower, it fires on the requests a busy GPU fleet queues and moves ``ttft``'s
# placements: at 1.5 a worker slowed to half speed got 0.06-0.19 of the requests where its
# speed says 0.195 (uniform-mixed-slowdown, seeds 600-607), at 3 one in eight seeds starved
# it on 500-507; at 6 the placements are those without it.
_LATE = 6.0


class FleetSpeed:
    """Per-worker speed estimates, fed request by request (module docs)."""

    def __init__(
        self,
        prior: Speed,
        *,
        forgetting: float = 0.96,
        clip: float = 3.0,
        warm: int = 8,
        max_pending: int = 65_536,
        fitted: tuple[bool, bool, bool, bool] = (True, True, True, True),
        tolerance: float = 0.0,
        band: float = 4.0,
        stale: float = 64.0,
        at_prior: bool = False,
        half_s: float = 60.0,
    ) -> None:
        self.prior = prior
        # The book drains at the prior's rate (``prior_of``), not the learned one.
        self.at_prior = at_prior
        self.half_s = half_s  # of what ``lately`` counts
        self._prior: Speed | None = None  # cached ``prior_of`` (``engine`` drops it)
        # A worker's prefill rate stays within ``band`` times its start (the prior, or the
        # fleet's, rescaled at its first observations): TTFTs that are mostly queueing once
        # drove the fit to 50x the prior's rate with the queue in a large overhead.
        self._band = band
        # A worker's estimate drifts back to the fleet's once it has gone without an
        # observation for ``stale`` times its fair share's spacing (``_aged``): one judged
        # slow from a queued start is tried again rather than starved for good. Slowly: at
        # 8 or 16, ``ttft`` gave the slowed worker of uniform-mixed-slowdown 0.06-0.19 of
        # the requests, its speed 0.195 (seeds 600-607: the like workers' estimates, pulled
        # to one median, traded places); at 64 as without.
        self._stale = stale
        # A warm worker whose prefill rate is within this share of the fleet's is predicted
        # with the fleet's estimate: on a fleet of like workers the fits differ by their
        # noise alone (4-10%), and placing by it sent one worker a quarter more of the
        # conversation trace's 10k-token openings than another (TTFT p99 +40%).
        self.tolerance = tolerance
        self._fitted = fitted  # which of the four parameters the fit may move

        self._lambda = forgetting
        self._clip = clip
        self._warm = warm
        self._max_pending = max_pending
        self._fits: dict[WorkerId, Fit] = {}
        self._pending: OrderedDict[str, Sent] = OrderedDict()
        self.books: dict[WorkerId, Book] = {}  # per worker: read ``Book.queued`` of it
        self._fleet: Speed | None = None  # cached ``fleet()`` (``_update`` drops it)
        self._updates = 0
        self._done: OrderedDict[str, Sent] = OrderedDict()  # recent ends, usage's tokens
        self._engine_prefill: dict[WorkerId, float] = {}  # as the engines report it (``engine``)
        self.log: deque[tuple[str, WorkerId, Seconds, Seconds, float]] = deque(maxlen=4096)
        """The latest observations: request id, worker, TTFT predicted at its send, observed,
        and the uncached tokens it was booked at (the caller's guess: ``sent``)."""
        self._due: list[tuple[float, str]] = []  # streamed requests' next lateness check

    # -- estimates ------------------------------------------------------------------

    def speed(self, worker: WorkerId) -> Speed:
        """The worker's estimate; the fleet's while it has too few observations."""
        fit = self._fits.get(worker)
        if fit is None or fit.speed is None or fit.n < self._warm:
            return self.fleet()
        return self._aged(fit)

    def fleet(self) -> Speed:
        """The median of the warm workers' estimates (while none is warm, of those seen at
        all: the prior only until the first observation)."""
        if self._fleet is None:
            warm = [f.theta for f in self._fits.values() if f.n >= self._warm]
            warm = warm or [f.theta for f in self._fits.values() if f.n]
            if warm:
                self._fleet = speed_of([statistics.median(t[i] for t in warm) for i in range(N)])
            elif self._engine_prefill:
                # Nothing observed yet: the engines' own measure of their prefill, not the
                # configured guess (a CPU llama.cpp prefills ~60 tokens/s, not 12,000).
                rate = statistics.median(self._engine_prefill.values())
                self._fleet = replace(self.prior, prefill_s=rate)
            else:
                self._fleet = self.prior
        return self._fleet

    def engine(self, worker: WorkerId, slots: int | None, prefill_s: float | None) -> bool:
        """What ``worker``'s engine reports of itself: its batch slots (a request past them
        waits for one to free: ``predict``) and its own mean prefill seconds a token (a prior
        before any observation: ``fleet``, ``prior_of``); True when that rate moved."""
        self._book(worker).slots = slots
        if not prefill_s or prefill_s <= 0.0 or self._engine_prefill.get(worker) == prefill_s:
            return False
        self._engine_prefill[worker] = prefill_s
        self._prior = None
        for other, book in self.books.items():  # drained at the prior's rate: it moved
            book.drain_s = self._front_s(other)
            book.moved()
        if not any(f.n for f in self._fits.values()):
            self._fleet = None
        return True

    def engines(self, workers: Iterable[WorkerState]) -> bool:
        """``engine`` for each of ``workers``, as the fleet reports them: True when any
        one's rate moved."""
        moved = False
        for w in workers:
            moved = self.engine(w.id, w.slots, w.engine_prefill_s) or moved
        return moved

    def prior_of(self, worker: WorkerId | None) -> Speed:
        """What ``worker`` is believed before it is observed: as ``fleet`` starts, the prior
        at the median of the engines' own prefill rates where they report one (``engine``:
        like workers' measures of one short request differ by their noise alone)."""
        if self._prior is None:
            reported = self._engine_prefill
            rate = statistics.median(reported.values()) if reported else None
            self._prior = replace(self.prior, prefill_s=rate) if rate else self.prior
        return self._prior

    def _book(self, worker: WorkerId) -> Book:
        """``worker``'s book, made if it has none."""
        book = self.books.get(worker)
        if book is None:
            book = self.books[worker] = Book(fit=self._fits.get(worker))
            book.drain_s = self._front_s(worker)
        return book

    def _front_s(self, worker: WorkerId) -> float:
        """The rate ``Book.front`` drains at: the prior's (``at_prior``), else none kept."""
        return self.prior_of(worker).prefill_s if self.at_prior else 0.0

    def _drain_s(self, worker: WorkerId) -> float:
        """Seconds a token the book of ``worker`` drains at (``at_prior``)."""
        return (self.prior_of(worker) if self.at_prior else self.speed(worker)).prefill_s

    def lately(self, worker: WorkerId, now: Seconds) -> tuple[float, float]:
        """Requests and uncached tokens sent to ``worker``, each halved every ``half_s``."""
        book = self.books.get(worker)
        if book is None:
            return 0.0, 0.0
        age = now - book.sent_at
        decay = math.exp2(-age / self.half_s) if age > 0.0 else 1.0
        return book.recent * decay, book.lately * decay

    def queue(self, worker: WorkerId, now: Seconds) -> tuple[float, int]:
        """This replica's book of ``worker`` at ``now``: uncached tokens still to prefill
        (of requests not yet at their first token, past its predicted time a request counts
        as started; drained at the worker's rate, or the prior's: ``at_prior``), and the
        rest of its requests in flight (decoding)."""
        book = self.books.get(worker)
        if book is None:
            return 0.0, 0
        return book.queued(now, self._drain_s(worker)), len(book.sent) - book.unstarted

    def look(self, worker: WorkerId, now: Seconds) -> Look:
        """``worker``'s speed and this replica's book of it at ``now``, good until the
        next change to either (``Look``)."""
        speed = self.speed(worker)
        book = self.books.get(worker)
        if book is None:
            return Look(speed, 0.0, 0.0, now, 0, 0, math.inf)
        starts = book.starts
        if starts and starts[0][0] <= now:
            book.settle(now)
        unstarted = book.unstarted
        until = starts[0][0] if starts else math.inf
        decoding = len(book.sent) - unstarted
        return Look(speed, book.tokens, book.backlog, book.as_of, unstarted, decoding, until)

    def predict(
        self,
        worker: WorkerId,
        uncached: float,
        now: Seconds,
        *,
        in_flight: int = 0,
        waiting: int | None = None,
        running: int | None = None,
        extra: float = 0.0,
        after: str = "",
    ) -> Seconds:
        """Predicted TTFT of a request with ``uncached`` tokens sent to ``worker`` at ``now``
        (plus ``extra`` tokens' worth of the worker's prefill time: a cost in tokens).

        ``in_flight``: the gateway's exact count of its requests there (a floor under the
        book's). ``waiting``/``running``: the engine's own counts from its last scrape, if
        it reports them: requests waiting there beyond this replica's own are others'
        work, counted at the worker's mean uncached tokens; its running count is a floor.
        ``after``: on an engine of slots, the request in flight there it waits for (the
        slot computing its prefix: ``_slotted``)."""
        # Called for every candidate of every placement: one look-up, plain arithmetic.
        book = self.books.get(worker)
        speed, tokens, unstarted, decoding, mean = self._fleet or self.fleet(), 0.0, 0, 0, uncached
        if book is not None:
            starts = book.starts
            if starts and starts[0][0] <= now:
                book.settle(now)
            fit = book.fit
            if fit is not None:
                mean = fit.uncached
                if fit.n >= self._warm and fit.speed is not None:
                    own = fit.speed
                    if self._updates - fit.last > self._stale * len(self._fits):
                        own = self._aged(fit)
                    if abs(own.prefill_s - speed.prefill_s) > self.tolerance * speed.prefill_s:
                        speed = own
            unstarted = book.unstarted
            tokens = book.ahead(now, speed.prefill_s) if unstarted else 0.0
            decoding = len(book.sent) - unstarted
        decoding = max(decoding, in_flight - unstarted)
        ahead = unstarted
        if waiting is not None and waiting + (running or 0) > decoding + unstarted:
            others = min(waiting, waiting + (running or 0) - decoding - unstarted)
            tokens += others * mean
            ahead += others
        if running is not None and running > decoding:
            decoding = running
        wait = 0.0
        if book is not None and book.slots:
            # The slots' batch, not a queue: what it shares its prefill with replaces the
            # tokens queued ahead (the engine's others' work stays).
            wait, shared = self._slotted(book, speed, uncached, now, after=after)
            tokens += shared - uncached - (book.ahead(now, speed.prefill_s) if unstarted else 0.0)
        return (
            speed.overhead_s
            + speed.prefill_s * (tokens + uncached + extra)
            + speed.decode_s * decoding
            + speed.queue_s * ahead
            + wait
        )

    @staticmethod
    def _slotted(
        book: Book, speed: Speed, uncached: float, now: Seconds, *, after: str = ""
    ) -> tuple[Seconds, float]:
        """``core.batch.shared_prefill`` on ``book``: the wait for a slot, and the prefill
        tokens this request's own are shared with (its own included). ``after``: a request
        in flight whose slot is computing this one's prefix (llama.cpp's slot plane holds
        it back for that slot, ``gateway.control.offload``): it waits for that one's end."""
        sent = book.sent
        index = list(sent).index(after) if after and after in sent else -1
        return shared_prefill(
            book.slots or 1, [s.first_at for s in sent.values()],
            [s.uncached * s.weight for s in sent.values()], uncached * context(book, uncached),
            book.mean, sent_at=[s.at for s in sent.values()], now=now,
            prefill_s=speed.prefill_s, decode_s=book.decode,
            rate=1.0 / book.gap if book.gap > 0.0 else 0.0, after=index,
        )  # fmt: skip

    def slot_cache(self, worker: WorkerId) -> bool:
        """Whether a request sent to ``worker`` now would find in its slot the KV it was
        sent there for: an engine of slots each with its own KV (llama.cpp) gives a new
        request a free slot, cold until it has served one, or one freed by a request
        that ends (warm: it held a prompt sent there). Always, where no slots are known."""
        book = self.books.get(worker)
        if book is None or not book.slots:
            return True
        present = len(book.sent)
        return present >= book.slots or min(book.used, book.slots) > present

    def report(self) -> dict[WorkerId, SpeedReport]:
        """Every worker seen: its estimate, observations and TTFT prediction error."""
        return {
            w: SpeedReport(self.speed(w), f.n, statistics.median(f.errors) if f.errors else None)
            for w, f in self._fits.items()
        }

    # -- observations -----------------------------------------------------------------

    def sent(
        self,
        request_id: str,
        worker: WorkerId,
        at: Seconds,
        uncached: float,
        *,
        streamed: bool = False,
        after: str = "",
        setup: Seconds = 0.0,
    ) -> Seconds:
        """``request_id`` (``uncached`` tokens, the caller's guess) went to ``worker`` at
        ``at``; returns its predicted TTFT. ``streamed``: its first token will be reported
        (``first_token``), so one late is a sign of a slower worker (``late``). ``after``:
        the request there it waits for (``predict``). ``setup``: seconds the driver takes
        before the engine has it (a slot restored first), predicted and not fitted."""
        self.late(at)
        book = self._book(worker)
        book.settle(at)
        # Their ids, to count their tokens as usage reports them, while they are few (a
        # queue hundreds deep is judged by the guesses: the list would cost more than it says).
        waiting = book.unstarted
        ahead = tuple(rid for rid, s in book.sent.items() if not s.started) if waiting <= 32 else ()
        running = len(book.sent) - waiting
        predicted = self.predict(worker, uncached, at, after=after) + setup
        wait, shared = 0.0, None
        if book.slots:
            wait, shared = self._slotted(book, self.speed(worker), uncached, at, after=after)
            book.sent_slot(at, uncached * context(book, uncached))
        wait += setup
        uncached = max(uncached, 0.0)
        queued = book.ahead(at, self._drain_s(worker)) if waiting else 0.0
        book.recent, book.lately = self.lately(worker, at)
        book.recent, book.lately, book.sent_at = book.recent + 1.0, book.lately + uncached, at
        sent = Sent(
            worker, at, uncached, predicted, ahead, book.tokens, book.backlog, book.as_of,
            waiting, running, wait=wait, shared=shared, awaiting=streamed,
            weight=context(book, uncached) if book.slots else 1.0, booked=uncached,
        )  # fmt: skip
        if streamed:
            heapq.heappush(self._due, (at + _LATE * predicted, request_id))
        self._pending[request_id] = book.sent[request_id] = sent
        book.tokens += uncached
        book.unstarted += 1
        book.backlog, book.as_of = queued + uncached, at
        # Unreported (a non-streamed answer's first token is its end), it counts as started
        # past twice its predicted time: a first token reported late still finds it queued.
        heapq.heappush(book.starts, (at + 2.0 * predicted, request_id))
        book.moved()
        while len(self._pending) > self._max_pending:
            self._forget(next(iter(self._pending)))
        return predicted

    def first_token(self, request_id: str, at: Seconds) -> None:
        """``request_id``'s first token arrived at ``at``: it no longer queues ahead of others."""
        sent = self._pending.get(request_id)
        if sent is not None:
            sent.awaiting = False
            book = self.books[sent.worker]
            book.start(sent)
            sent.first_at = at
            # All sent before it are done too: what is left is what is still unstarted.
            book.backlog, book.as_of = book.tokens, at
            book.moved()

    def ended(self, request_id: str, prompt_tokens: int, cached_tokens: int) -> None:
        """``request_id`` ended with ``usage``: it leaves the book; ``observed`` may fit it."""
        sent = self._forget(request_id)
        if sent is None:
            return
        sent.uncached = float(max(prompt_tokens - cached_tokens, 0))
        book = self.books.get(sent.worker)
        if book is not None and book.slots:
            context_ended(book, prompt_tokens, cached_tokens)
        self._done[request_id] = sent
        while len(self._done) > 4096:
            self._done.popitem(last=False)

    def observed(
        self, request_id: str, ttft: Seconds | None, *, seen: Seconds | None = None
    ) -> None:
        """The ended ``request_id``'s TTFT as the gateway saw it, from its send (``None``:
        no first token seen, nothing to learn): fit its worker's speed to it. ``seen``: the
        gateway's own where ``ttft`` is the engine's (a wait on the gateway's clock is read
        on the engine's through their ratio: ``late``)."""
        sent = self._done.get(request_id)
        if sent is None or ttft is None or ttft <= 0.0 or not math.isfinite(ttft):
            return
        fit = self._fit(sent.worker)
        if seen is not None and math.isfinite(seen):
            ratio = max(seen / ttft, 1.0)
            fit.stretch = ratio if not fit.stretch else fit.stretch + 0.1 * (ratio - fit.stretch)
        fit.uncached += 0.1 * (sent.uncached - fit.uncached) if fit.n else sent.uncached
        # The slot wait is the book's (``held``), not the fit's: fitted, it would pass for
        # overhead and be predicted again for requests that find a slot free.
        y = max(ttft - sent.wait, 0.1 * ttft)
        fit.ttfts.append(y)
        self._update(fit, self._features(fit, sent), y, sent.worker)
        fit.errors.append(abs(sent.predicted - ttft) / ttft)
        self.log.append((request_id, sent.worker, sent.predicted, ttft, sent.booked))

    def held(self, request_id: str, decoded: Seconds) -> None:
        """The observed ``request_id`` decoded ``decoded`` seconds after its first token."""
        sent = self._done.get(request_id)
        book = self.books.get(sent.worker) if sent is not None else None
        if book is None or not book.slots or not 0.0 <= decoded < math.inf:
            return
        book.decode = decoded if not book.decode else book.decode + 0.2 * (decoded - book.decode)

    def late(self, now: Seconds) -> bool:
        """Fit what the streamed requests still without a first token at ``now`` say: each
        past ``_LATE`` times its predicted TTFT is a lower bound on its TTFT (a censored
        observation), fitted where the worker's estimate predicts less, and checked again
        at twice its wait: a worker far slower than believed (a CPU engine against a GPU
        prior, a stalled one) is known in seconds, not at its first answer."""
        due, moved = self._due, False
        while due and due[0][0] <= now:
            _, rid = heapq.heappop(due)
            sent = self._pending.get(rid)
            if sent is None or not sent.awaiting:
                continue
            fit = self._fit(sent.worker)
            # On the engine's clock, at most; the slot wait the book predicted is not the fit's.
            waited = (now - sent.at) / max(fit.stretch, 1.0) - sent.wait
            features = self._features(fit, sent)
            theta = fit.theta
            predicted = sum(t * f * s for t, f, s in zip(theta, features, SCALE, strict=True))
            if predicted < waited:
                self._update(fit, features, waited, sent.worker)
                moved = True
            heapq.heappush(due, (sent.at + 2.0 * (now - sent.at), rid))
        if len(due) > 2 * self._max_pending:  # checks of requests long gone
            self._due = [d for d in due if d[1] in self._pending]
            heapq.heapify(self._due)
        return moved

    def dropped(self, request_id: str) -> None:
        """``request_id`` left with nothing to learn from (failed, cancelled)."""
        self._forget(request_id)

    def forget_worker(self, worker: WorkerId) -> None:
        """``worker`` left the fleet."""
        book = self.books.pop(worker, None)
        for rid in book.sent if book is not None else ():
            self._pending.pop(rid, None)
        self._fits.pop(worker, None)
        self._fleet = None

    # -- the fit ----------------------------------------------------------------------

    def _features(self, fit: Fit, sent: Sent) -> tuple[float, ...]:
        """The fit's inputs for ``sent``: one (overhead), the uncached tokens ahead of it and
        its own, the requests decoding and those waiting ahead when it was sent."""
        # What was still to prefill ahead of it, drained at the rate learned by now (the
        # rate at its send may have been the prior's, far off), scaled to usage's truth.
        prefill, ahead = fit.theta[1] * SCALE[1], 0.0
        if sent.waiting and prefill > 0.0:
            left = sent.backlog - (sent.at - sent.as_of) / prefill
            ahead = min(sent.guessed, left) if left > 0.0 else 0.0
        if ahead and sent.ahead and sent.guessed > 0.0:
            ahead *= sum(self._tokens(rid) for rid in sent.ahead) / sent.guessed
        tokens = ahead + sent.uncached if sent.shared is None else sent.shared
        return (1.0, tokens, float(sent.running), float(sent.waiting))

    def _aged(self, fit: Fit) -> Speed:
        """``fit``'s speed, drawn toward the fleet's as it goes without observations: past
        ``stale`` times a fair share's spacing, the gap to the fleet's halves as often."""
        own = fit.speed
        assert own is not None
        span = self._stale * len(self._fits)
        age = self._updates - fit.last
        if age <= span:
            return own
        w = math.exp2(-(age - span) / span)
        f = self.fleet()
        return Speed(
            f.overhead_s + w * (own.overhead_s - f.overhead_s),
            f.prefill_s + w * (own.prefill_s - f.prefill_s),
            f.decode_s + w * (own.decode_s - f.decode_s),
            f.queue_s + w * (own.queue_s - f.queue_s),
        )

    def _tokens(self, request_id: str) -> float:
        done = self._done.get(request_id)
        if done is not None:
            return done.uncached
        sent = self._pending.get(request_id)
        return sent.uncached if sent is not None else 0.0

    def _forget(self, request_id: str) -> Sent | None:
        sent = self._pending.pop(request_id, None)
        if sent is not None:
            book = self.books[sent.worker]
            book.start(sent)
            del book.sent[request_id]
            if not book.sent:
                book.starts.clear()
            book.moved()
        return sent

    def _fit(self, worker: WorkerId) -> Fit:
        fit = self._fits.get(worker)
        if fit is None:
            start = self.fleet()  # a new worker starts from the fleet's estimate
            theta = [start.overhead_s, start.prefill_s, start.decode_s, start.queue_s]
            theta = [t / s for t, s in zip(theta, SCALE, strict=True)]
            # Prior spread: the parameters' own size (about 100% uncertain), at least a floor.
            p = [[0.0] * N for _ in range(N)]
            for i in range(N):
                p[i][i] = spread(theta[i]) if self._fitted[i] else 0.0
            fit = self._fits[worker] = Fit(theta, p, anchor=theta[1], last=self._updates)
            book = self.books.get(worker)
            if book is not None:
                book.fit = fit
        return fit

    def _update(self, fit: Fit, features: tuple[float, ...], y: Seconds, worker: WorkerId) -> None:
        if fit.n >= self._warm and fit.speed is not None:
            aged = self._aged(fit)
            if aged is not fit.speed:  # back from a spell without observations: start
                fit.theta[:] = [v / s for v, s in zip(theta_of(aged), SCALE, strict=True)]
        # An engine of slots that reports its own prefill rate (llama.cpp) started from it:
        # no prior far off to rescale, and its first TTFTs, slot waits and batches beside
        # others' cold prompts, are the noisiest (one rescaled a fit to 508 tokens/s where
        # /metrics said 43: real_engine.py --rate 0.4 --seed 2).
        book = self.books.get(worker)
        reported = book is not None and bool(book.slots) and worker in self._engine_prefill
        fit.step(
            features, y, lam=self._lambda, clip=self._clip, warm=self._warm,
            fitted=self._fitted, band=self._band, rescale=not reported,
        )  # fmt: skip
        fit.last = self._updates
        # The fleet's median is for workers not yet warm: refreshed as one turns warm, and
        # every 64 updates after (not on every one: it costs a sort per parameter).
        self._updates += 1
        if fit.n <= self._warm or self._updates % 64 == 0:
            self._fleet = None
