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

An engine that reports its batch slots (llama.cpp's ``/slots``: ``engine``) is no queue
(``core.batch``): the fit sees the tokens a request's prefill shared the batch with, and
its TTFT less its wait for a slot (the book's, with the decoding time measured: ``held``).

Starts from a prior (the profile or config; before any observation, the engines' own
measure of their prefill where they report it: ``engine``); a worker seen fewer than
``warm`` times is predicted with the fleet's estimate (the median of the warm workers'
parameters, or while none is warm of those seen at all). A prior off by more than twice is
rescaled at a worker's first observations (a CPU engine against a GPU profile: the fit's
relative steps would take hundreds of requests to cross a factor of a hundred). Pure: no
clock (times are passed in), no I/O.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from kvgate.core.batch import shared_prefill
from kvgate.types import Seconds, WorkerId

_SCALE = (1.0, 1e-3, 0.1, 0.1)  # features in units that keep the fit well conditioned
_N = len(_SCALE)


@dataclass(frozen=True, slots=True)
class Speed:
    """One worker's speed: fixed overhead (s), prefill (s per uncached token), decode (s per
    running request), and queueing (s per request waiting ahead, beyond its prefill: for
    a batch slot or KV room)."""

    overhead_s: float
    prefill_s: float
    decode_s: float
    queue_s: float = 0.0

    def ttft(self, tokens: float, running: float, waiting: float = 0.0) -> Seconds:
        """Predicted time to first token behind ``tokens`` uncached tokens (its own and those
        ahead), ``running`` requests decoding and ``waiting`` requests ahead."""
        return (
            self.overhead_s
            + self.prefill_s * tokens
            + self.decode_s * running
            + self.queue_s * waiting
        )


class Look(NamedTuple):
    """What ``FleetSpeed.predict`` reads of one worker, as of a change, for a policy that
    keeps it until the next one (its own requests' sends and ends, the worker's fit) or
    ``until`` (a request's predicted start): ``queued(now)`` drains the backlog."""

    speed: Speed
    tokens: float  # uncached tokens of the requests not yet started
    backlog: float  # uncached tokens left to prefill as of ``as_of`` (``_Book.ahead``)
    as_of: Seconds
    unstarted: int
    decoding: int
    until: Seconds  # the next predicted start: the look is stale from then

    def queued(self, now: Seconds) -> float:
        """Uncached tokens still to prefill at ``now`` (``_Book.ahead``)."""
        prefill_s = self.speed.prefill_s
        left = self.backlog - (now - self.as_of) / prefill_s if prefill_s > 0.0 else 0.0
        return (self.tokens if self.tokens < left else left) if left > 0.0 else 0.0


@dataclass(frozen=True, slots=True)
class Observation:
    """What the gateway saw of one attempt, reported at its end: ``ttft`` from sending it
    to the first token (``None``: none came), ``usage``'s tokens, the mean time between
    output tokens after the first (``itl``, ``None``: not streamed), and the engine's own
    TTFT where its ``usage`` reports one (``engine_ttft``, in the engine's seconds: the
    emulated worker's model clock), free of the network and of the gateway's machine."""

    ttft: Seconds | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int = 0
    itl: Seconds | None = None
    engine_ttft: Seconds | None = None


@dataclass(frozen=True, slots=True)
class SpeedReport:
    """What ``/metrics`` shows of one worker: its speed, observations, and the median
    absolute relative error of the TTFT predicted at send time (``None``: none yet)."""

    speed: Speed
    observations: int
    ttft_error: float | None


@dataclass(slots=True)
class _Sent:
    worker: WorkerId
    at: Seconds
    uncached: float  # the guess at send; usage's truth when it ends
    predicted: Seconds
    ahead: tuple[str, ...]  # requests not at their first token when it was sent (up to 32)
    guessed: float  # their uncached tokens as guessed then (all of them)
    backlog: float  # the book's backlog then and as of when (``_Book.ahead``): drained
    as_of: float  # again at the fit, at the rate learned by then
    waiting: int  # how many they were
    running: int
    started: bool = False  # at its first token, or past its predicted time
    wait: float = 0.0  # of ``predicted``: the wait for an engine slot (``engine``)
    shared: float | None = None  # slotted engine: the prefill tokens its own was shared with
    first_at: float | None = None  # when its first token came


@dataclass(slots=True)
class _Book:
    """One worker's requests in flight from this replica; ``tokens``/``unstarted``: those
    not yet started, ``starts``: their predicted start times (entries of started ones stay
    until popped)."""

    sent: dict[str, _Sent] = field(default_factory=dict)
    starts: list[tuple[float, str]] = field(default_factory=list)
    tokens: float = 0.0
    unstarted: int = 0
    fit: _Fit | None = None  # the worker's fit, once it has one
    decode: float = 0.0  # mean seconds a request decodes after its first token (``held``)
    slots: int | None = None  # the engine's batch slots, where it reports them (``engine``)
    last_sent: float | None = None  # for ``rate``: requests sent here a second (mean)
    used: int = 0  # requests ever sent here (while fewer than the slots, some slots are cold)
    rate: float = 0.0
    backlog: float = 0.0  # uncached tokens left to prefill as of ``as_of`` (``ahead``)
    as_of: float = 0.0

    def ahead(self, now: Seconds, prefill_s: float) -> float:
        """Uncached tokens still to prefill at ``now``: the backlog drained at ``prefill_s``
        seconds a token since ``as_of``, at most the unstarted requests' tokens."""
        left = self.backlog - (now - self.as_of) / prefill_s if prefill_s > 0.0 else 0.0
        return min(self.tokens, left) if left > 0.0 else 0.0

    def start(self, sent: _Sent) -> None:
        if not sent.started:
            sent.started = True
            self.tokens -= sent.uncached
            self.unstarted -= 1
            if not self.unstarted:
                self.tokens = 0.0  # no float drift past an empty queue

    def settle(self, now: Seconds) -> None:
        starts = self.starts
        while starts and starts[0][0] <= now:
            _, rid = heapq.heappop(starts)
            sent = self.sent.get(rid)
            if sent is not None:
                self.start(sent)


@dataclass(slots=True)
class _Fit:
    theta: list[float]
    p: list[list[float]]
    n: int = 0
    scale: float = 0.3  # running mean absolute relative error, for clipping
    bias: float = 0.0  # running mean relative error: a run of one sign is a change, no outlier
    errors: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    uncached: float = 0.0  # mean uncached tokens a request (the engine's others' work)
    speed: Speed | None = None  # ``theta`` as a ``Speed``, rebuilt on each update
    floor: float = 0.05  # the least spread of a parameter (``_spread``): grows with a rescale


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
    ) -> None:
        self.prior = prior
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
        self._fits: dict[WorkerId, _Fit] = {}
        self._pending: OrderedDict[str, _Sent] = OrderedDict()
        self._books: dict[WorkerId, _Book] = {}
        self._fleet: Speed | None = None  # cached ``fleet()`` (``_update`` drops it)
        self._updates = 0
        self._done: OrderedDict[str, _Sent] = OrderedDict()  # recent ends, usage's tokens
        self._engine_prefill: dict[WorkerId, float] = {}  # as the engines report it (``engine``)
        self.log: deque[tuple[str, WorkerId, Seconds, Seconds]] = deque(maxlen=4096)
        """The latest observations: request id, worker, TTFT predicted at its send, observed."""

    # -- estimates ------------------------------------------------------------------

    def speed(self, worker: WorkerId) -> Speed:
        """The worker's estimate; the fleet's while it has too few observations."""
        fit = self._fits.get(worker)
        if fit is None or fit.speed is None or fit.n < self._warm:
            return self.fleet()
        return fit.speed

    def fleet(self) -> Speed:
        """The median of the warm workers' estimates (while none is warm, of those seen at
        all: the prior only until the first observation)."""
        if self._fleet is None:
            warm = [f.theta for f in self._fits.values() if f.n >= self._warm]
            warm = warm or [f.theta for f in self._fits.values() if f.n]
            if warm:
                self._fleet = _speed([statistics.median(t[i] for t in warm) for i in range(_N)])
            elif self._engine_prefill:
                # Nothing observed yet: the engines' own measure of their prefill, not the
                # configured guess (a CPU llama.cpp prefills ~60 tokens/s, not 12,000).
                rate = statistics.median(self._engine_prefill.values())
                self._fleet = replace(self.prior, prefill_s=rate)
            else:
                self._fleet = self.prior
        return self._fleet

    def engine(self, worker: WorkerId, slots: int | None, prefill_s: float | None) -> None:
        """What ``worker``'s engine reports of itself: its batch slots (a request past them
        waits for one to free: ``predict``) and its own mean prefill seconds a token (the
        prior of a fleet that has observed nothing yet)."""
        book = self._books.get(worker)
        if book is None:
            book = self._books[worker] = _Book(fit=self._fits.get(worker))
        book.slots = slots
        if prefill_s and prefill_s > 0.0 and self._engine_prefill.get(worker) != prefill_s:
            self._engine_prefill[worker] = prefill_s
            if not any(f.n for f in self._fits.values()):
                self._fleet = None

    def queue(self, worker: WorkerId, now: Seconds) -> tuple[float, int]:
        """This replica's book of ``worker`` at ``now``: uncached tokens still to prefill
        (of requests not yet at their first token, past its predicted time a request counts
        as started; drained at the worker's rate), and the rest of its requests in flight
        (decoding)."""
        book = self._books.get(worker)
        if book is None:
            return 0.0, 0
        book.settle(now)
        ahead = book.ahead(now, self.speed(worker).prefill_s) if book.unstarted else 0.0
        return ahead, len(book.sent) - book.unstarted

    def queued_s(self, worker: WorkerId, now: Seconds) -> Seconds:
        """Seconds of prefill still queued on ``worker`` at ``now`` (this replica's book)."""
        book = self._books.get(worker)
        if book is None or not book.unstarted:
            return 0.0
        prefill_s = self.speed(worker).prefill_s
        return book.ahead(now, prefill_s) * prefill_s

    def look(self, worker: WorkerId, now: Seconds) -> Look:
        """``worker``'s speed and this replica's book of it at ``now``, good until the
        next change to either (``Look``)."""
        speed = self.speed(worker)
        book = self._books.get(worker)
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
    ) -> Seconds:
        """Predicted TTFT of a request with ``uncached`` tokens sent to ``worker`` at ``now``
        (plus ``extra`` tokens' worth of the worker's prefill time: a cost in tokens).

        ``in_flight``: the gateway's exact count of its requests there (a floor under the
        book's). ``waiting``/``running``: the engine's own counts from its last scrape, if
        it reports them: requests waiting there beyond this replica's own are others'
        work, counted at the worker's mean uncached tokens; its running count is a floor."""
        # Called for every candidate of every placement: one look-up, plain arithmetic.
        book = self._books.get(worker)
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
            wait, shared = self._slotted(book, speed, uncached, mean, now)
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
        book: _Book, speed: Speed, uncached: float, mean: float, now: Seconds
    ) -> tuple[Seconds, float]:
        """``core.batch.shared_prefill`` on ``book``: the wait for a slot, and the prefill
        tokens this request's own are shared with (its own included)."""
        holders = [s.first_at for s in book.sent.values()]
        tokens = [s.uncached for s in book.sent.values()]
        return shared_prefill(
            book.slots or 1, holders, tokens, uncached, mean, now=now,
            prefill_s=speed.prefill_s, decode_s=book.decode, rate=book.rate,
        )  # fmt: skip

    def slot_cache(self, worker: WorkerId) -> bool:
        """Whether a request sent to ``worker`` now would find in its slot the KV it was
        sent there for: an engine of slots each with its own KV (llama.cpp) gives a new
        request a free slot, cold until it has served one, or one freed by a request
        that ends (warm: it held a prompt sent there). Always, where no slots are known."""
        book = self._books.get(worker)
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

    def sent(self, request_id: str, worker: WorkerId, at: Seconds, uncached: float) -> Seconds:
        """``request_id`` (``uncached`` tokens, the caller's guess) went to ``worker`` at
        ``at``; returns its predicted TTFT."""
        book = self._books.get(worker)
        if book is None:
            book = self._books[worker] = _Book(fit=self._fits.get(worker))
        book.settle(at)
        # Their ids, to count their tokens as usage reports them, while they are few (a
        # queue hundreds deep is judged by the guesses: the list would cost more than it says).
        waiting = book.unstarted
        ahead = tuple(rid for rid, s in book.sent.items() if not s.started) if waiting <= 32 else ()
        running = len(book.sent) - waiting
        predicted = self.predict(worker, uncached, at)
        wait, shared = 0.0, None
        if book.slots:
            fit = book.fit
            mean = fit.uncached if fit is not None else uncached
            wait, shared = self._slotted(book, self.speed(worker), uncached, mean, at)
            if book.last_sent is not None and at > book.last_sent:
                book.rate += 0.2 * (1.0 / (at - book.last_sent) - book.rate)
            book.last_sent = at
            book.used += 1
        uncached = max(uncached, 0.0)
        queued = book.ahead(at, self.speed(worker).prefill_s) if waiting else 0.0
        sent = _Sent(
            worker, at, uncached, predicted, ahead, book.tokens, book.backlog, book.as_of,
            waiting, running, wait=wait, shared=shared,
        )  # fmt: skip
        self._pending[request_id] = book.sent[request_id] = sent
        book.tokens += uncached
        book.unstarted += 1
        book.backlog, book.as_of = queued + uncached, at
        # Unreported (a non-streamed answer's first token is its end), it counts as started
        # past twice its predicted time: a first token reported late still finds it queued.
        heapq.heappush(book.starts, (at + 2.0 * predicted, request_id))
        while len(self._pending) > self._max_pending:
            self._forget(next(iter(self._pending)))
        return predicted

    def first_token(self, request_id: str, at: Seconds) -> None:
        """``request_id``'s first token arrived at ``at``: it no longer queues ahead of others."""
        sent = self._pending.get(request_id)
        if sent is not None:
            book = self._books[sent.worker]
            book.start(sent)
            sent.first_at = at
            # All sent before it are done too: what is left is what is still unstarted.
            book.backlog, book.as_of = book.tokens, at

    def ended(self, request_id: str, prompt_tokens: int, cached_tokens: int) -> None:
        """``request_id`` ended with ``usage``: it leaves the book; ``observed`` may fit it."""
        sent = self._forget(request_id)
        if sent is None:
            return
        sent.uncached = float(max(prompt_tokens - cached_tokens, 0))
        self._done[request_id] = sent
        while len(self._done) > 4096:
            self._done.popitem(last=False)

    def observed(self, request_id: str, ttft: Seconds | None) -> None:
        """The ended ``request_id``'s TTFT as the gateway saw it, from its send (``None``:
        no first token seen, nothing to learn): fit its worker's speed to it."""
        sent = self._done.get(request_id)
        if sent is None or ttft is None or ttft <= 0.0 or not math.isfinite(ttft):
            return
        fit = self._fit(sent.worker)
        # What was still to prefill ahead of it, drained at the rate learned by now (the
        # rate at its send may have been the prior's, far off), scaled to usage's truth.
        prefill, ahead = fit.theta[1] * _SCALE[1], 0.0
        if sent.waiting and prefill > 0.0:
            left = sent.backlog - (sent.at - sent.as_of) / prefill
            ahead = min(sent.guessed, left) if left > 0.0 else 0.0
        if ahead and sent.ahead and sent.guessed > 0.0:
            ahead *= sum(self._tokens(rid) for rid in sent.ahead) / sent.guessed
        fit.uncached += 0.1 * (sent.uncached - fit.uncached) if fit.n else sent.uncached
        tokens = ahead + sent.uncached if sent.shared is None else sent.shared
        features = (1.0, tokens, float(sent.running), float(sent.waiting))
        # The slot wait is the book's (``held``), not the fit's: fitted, it would pass for
        # overhead and be predicted again for requests that find a slot free.
        self._update(fit, features, max(ttft - sent.wait, 0.1 * ttft))
        fit.errors.append(abs(sent.predicted - ttft) / ttft)
        self.log.append((request_id, sent.worker, sent.predicted, ttft))

    def held(self, request_id: str, decoded: Seconds) -> None:
        """The observed ``request_id`` decoded ``decoded`` seconds after its first token."""
        sent = self._done.get(request_id)
        book = self._books.get(sent.worker) if sent is not None else None
        if book is None or not book.slots or not 0.0 <= decoded < math.inf:
            return
        book.decode = decoded if not book.decode else book.decode + 0.2 * (decoded - book.decode)

    def dropped(self, request_id: str) -> None:
        """``request_id`` left with nothing to learn from (failed, cancelled)."""
        self._forget(request_id)

    def forget_worker(self, worker: WorkerId) -> None:
        """``worker`` left the fleet."""
        book = self._books.pop(worker, None)
        for rid in book.sent if book is not None else ():
            self._pending.pop(rid, None)
        self._fits.pop(worker, None)
        self._fleet = None

    # -- the fit ----------------------------------------------------------------------

    def _tokens(self, request_id: str) -> float:
        done = self._done.get(request_id)
        if done is not None:
            return done.uncached
        sent = self._pending.get(request_id)
        return sent.uncached if sent is not None else 0.0

    def _forget(self, request_id: str) -> _Sent | None:
        sent = self._pending.pop(request_id, None)
        if sent is not None:
            book = self._books[sent.worker]
            book.start(sent)
            del book.sent[request_id]
            if not book.sent:
                book.starts.clear()
        return sent

    def _fit(self, worker: WorkerId) -> _Fit:
        fit = self._fits.get(worker)
        if fit is None:
            start = self.fleet()  # a new worker starts from the fleet's estimate
            theta = [start.overhead_s, start.prefill_s, start.decode_s, start.queue_s]
            theta = [t / s for t, s in zip(theta, _SCALE, strict=True)]
            # Prior spread: the parameters' own size (about 100% uncertain), at least a floor.
            p = [[0.0] * _N for _ in range(_N)]
            for i in range(_N):
                p[i][i] = _spread(theta[i]) if self._fitted[i] else 0.0
            fit = self._fits[worker] = _Fit(theta, p)
            book = self._books.get(worker)
            if book is not None:
                book.fit = fit
        return fit

    def _update(self, fit: _Fit, features: tuple[float, ...], y: Seconds) -> None:
        x = [f * s for f, s in zip(features, _SCALE, strict=True)]
        theta, p, lam = fit.theta, fit.p, self._lambda
        predicted = sum(t * xi for t, xi in zip(theta, x, strict=True))
        if fit.n < self._warm and predicted > 0.0 and not 0.5 <= y / predicted <= 2.0:
            # A prior off by more than twice (an engine far slower or faster than the
            # profile said, e.g. a CPU llama.cpp against an H100 prior): rescale it at
            # once, in proportion. The fit's steps are relative, so from a prior a
            # hundred times off they would take hundreds of requests to get there.
            ratio = y / predicted
            for i in range(_N):
                if self._fitted[i]:
                    theta[i] *= ratio
                    for j in range(_N):
                        p[i][j] *= ratio * (ratio if self._fitted[j] else 1.0)
            # A parameter at nought is not rescaled: its room to move grows instead (a
            # queue the prior never saw, e.g. a llama.cpp worker's requests waiting a slot).
            fit.floor *= max(ratio, 1.0)
            for i in range(_N):
                if self._fitted[i]:
                    p[i][i] = max(p[i][i], _spread(theta[i], fit.floor))
            predicted = y
        # Relative errors: weigh the observation by 1 / its size.
        w = 1.0 / max(predicted, y, 1e-6)
        x = [xi * w for xi in x]
        error = (y - predicted) * w
        bound = self._clip * fit.scale
        fit.bias += 0.2 * (max(min(error, 1.0), -1.0) - fit.bias)
        if fit.n >= self._warm and abs(error) > bound and abs(fit.bias) < bound:
            error = math.copysign(bound, error)  # an outlier moves the fit only so far
        fit.scale += 0.05 * (min(abs(error), 2.0) - fit.scale)
        fit.scale = max(fit.scale, 0.02)
        px = [sum(p[i][j] * x[j] for j in range(_N)) for i in range(_N)]
        denom = lam + sum(x[i] * px[i] for i in range(_N))
        gain = [v / denom for v in px]
        for i in range(_N):
            theta[i] += gain[i] * error
            theta[i] = max(theta[i], 0.0)
        theta[1] = max(theta[1], self.prior.prefill_s / _SCALE[1] / 50.0)
        for i in range(_N):
            for j in range(_N):
                p[i][j] = (p[i][j] - gain[i] * px[j]) / lam
        # Forgetting inflates directions no observation excites: cap each variance at its
        # prior spread so a long run of look-alike requests cannot wind the gain up.
        for i in range(_N):
            cap = _spread(theta[i], fit.floor) if self._fitted[i] else 0.0
            if p[i][i] > cap:
                r = math.sqrt(cap / p[i][i]) if cap > 0.0 else 0.0
                for j in range(_N):
                    p[i][j] *= r
                    p[j][i] *= r
        fit.n += 1
        fit.speed = _speed(theta)
        # The fleet's median is for workers not yet warm: refreshed as one turns warm, and
        # every 64 updates after (not on every one: it costs a sort per parameter).
        self._updates += 1
        if fit.n <= self._warm or self._updates % 64 == 0:
            self._fleet = None


def _speed(theta: list[float]) -> Speed:
    return Speed(*(t * s for t, s in zip(theta, _SCALE, strict=True)))


def _spread(theta: float, floor: float = 0.05) -> float:
    """A parameter's prior variance: its own size (about 100% uncertain), with a floor."""
    return max(theta, floor) ** 2 * 4.0
