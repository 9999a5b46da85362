"""What ``core.speed.FleetSpeed`` books of each worker: the requests it was sent (``Sent``),
those not yet at their first token and what is left of their prefill (``Book``), and what a
policy reads of that as of a change (``Look``); the module docs of ``core.speed`` say how.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from kvgate.core.speed_fit import Fit, Speed
from kvgate.types import Seconds, WorkerId


class Look(NamedTuple):
    """What ``FleetSpeed.predict`` reads of one worker, as of a change, for a policy that
    keeps it until the next one (its own requests' sends and ends, the worker's fit) or
    ``until`` (a request's predicted start): ``queued(now)`` drains the backlog."""

    speed: Speed
    tokens: float  # uncached tokens of the requests not yet started
    backlog: float  # uncached tokens left to prefill as of ``as_of`` (``Book.ahead``)
    as_of: Seconds
    unstarted: int
    decoding: int
    until: Seconds  # the next predicted start: the look is stale from then

    def queued(self, now: Seconds) -> float:
        """Uncached tokens still to prefill at ``now`` (``Book.ahead``)."""
        prefill_s = self.speed.prefill_s
        left = self.backlog - (now - self.as_of) / prefill_s if prefill_s > 0.0 else 0.0
        return (self.tokens if self.tokens < left else left) if left > 0.0 else 0.0


@dataclass(slots=True)
class Sent:
    worker: WorkerId
    at: Seconds
    uncached: float  # the guess at send; usage's truth when it ends
    predicted: Seconds
    ahead: tuple[str, ...]  # requests not at their first token when it was sent (up to 32)
    guessed: float  # their uncached tokens as guessed then (all of them)
    backlog: float  # the book's backlog then and as of when (``Book.ahead``): drained
    as_of: float  # again at the fit, at the rate learned by then
    waiting: int  # how many they were
    running: int
    started: bool = False  # at its first token, or past its predicted time
    wait: float = 0.0  # of ``predicted``: the wait for an engine slot (``engine``)
    shared: float | None = None  # slotted engine: the prefill tokens its own was shared with
    first_at: float | None = None  # when its first token came
    awaiting: bool = False  # streamed, no first token yet: a late one says "slower" (``late``)
    weight: float = 1.0  # slotted engine: what a token of it costs, over its context (``context``)
    booked: float = 0.0  # the uncached tokens guessed at its send (``uncached`` is usage's, later)


Front = tuple[float, float, float]
"""A book's queue as a policy reads it at every decision (``Book.front``), in seconds at the
book's ``drain_s``: when it drains, the most it owes, and the next predicted start."""

IDLE: Front = (-math.inf, 0.0, math.inf)


@dataclass(slots=True)
class Book:
    """One worker's requests in flight from this replica; ``tokens``/``unstarted``: those
    not yet started, ``starts``: their predicted start times (entries of started ones stay
    until popped). Whatever changes those ends with ``moved``: ``front`` is read for every
    candidate of every placement (``default``), one tuple kept from one change to the next."""

    sent: dict[str, Sent] = field(default_factory=dict)
    starts: list[tuple[float, str]] = field(default_factory=list)
    tokens: float = 0.0
    unstarted: int = 0
    fit: Fit | None = None  # the worker's fit, once it has one
    decode: float = 0.0  # mean seconds a request decodes after its first token (``held``)
    slots: int | None = None  # the engine's batch slots, where it reports them (``engine``)
    last_sent: float | None = None  # slotted engine: the last send, the mean seconds
    gap: float = 0.0  # between sends and the mean weighed tokens sent (``sent_slot``)
    mean: float = 0.0
    used: int = 0  # requests ever sent here (while fewer than the slots, some slots are cold)
    prompt: float = 0.0  # slotted engine: mean prompt tokens of those ended, and cached ones
    cached: float = 0.0  # of those that found any (``context``)
    recent: float = 0.0  # requests and uncached tokens sent lately, as of ``sent_at``
    lately: float = 0.0  # (``FleetSpeed.lately``)
    sent_at: float = 0.0
    backlog: float = 0.0  # uncached tokens left to prefill as of ``as_of`` (``ahead``)
    as_of: float = 0.0
    drain_s: float = 0.0  # seconds a token ``front`` drains at (0: not kept, ``IDLE``)
    front: Front = IDLE
    """``ahead`` in seconds as of the last change (``moved``), for a policy that drains at
    the prior's rate (``FleetSpeed(at_prior=True)``): the queue left at ``now`` is
    ``drains - now`` within ``[0, owes]`` until ``front[2]``, the next predicted start (from
    then: ``settled``)."""

    def sent_slot(self, at: Seconds, tokens: float) -> None:
        """A request of ``tokens`` (weighed: ``context``) was sent to this engine of slots
        at ``at``: the rate and size of those that may join a prefill (``core.batch``).
        The mean gap, not the mean of 1 / gap: two sends a few ms apart made it hundreds a
        second, and with the mean at the cold first wave's tokens, every quiet 50-token
        turn was predicted beside joiners that never came (real llama.cpp, 2x long)."""
        if self.last_sent is not None and at > self.last_sent:
            gap = at - self.last_sent
            self.gap += (gap - self.gap) * (0.2 if self.gap else 1.0)
        self.last_sent = at
        self.mean += (tokens - self.mean) * (0.2 if self.mean else 1.0)
        self.used += 1

    def moved(self) -> None:
        """The queue or its rate changed: ``front`` is made again."""
        drain_s, starts = self.drain_s, self.starts
        if not self.unstarted or drain_s <= 0.0:
            self.front = IDLE
            return
        until = starts[0][0] if starts else math.inf
        self.front = (self.as_of + self.backlog * drain_s, self.tokens * drain_s, until)

    def settled(self, now: Seconds) -> Front:
        """``front`` at ``now``, the requests past their predicted start started (``settle``)."""
        self.settle(now)
        return self.front

    def ahead(self, now: Seconds, prefill_s: float) -> float:
        """Uncached tokens still to prefill at ``now``: the backlog drained at ``prefill_s``
        seconds a token since ``as_of``, at most the unstarted requests' tokens."""
        left = self.backlog - (now - self.as_of) / prefill_s if prefill_s > 0.0 else 0.0
        return min(self.tokens, left) if left > 0.0 else 0.0

    def queued(self, now: Seconds, prefill_s: float) -> float:
        """``ahead``, the requests past their predicted start started first (``settle``)."""
        starts = self.starts
        if starts and starts[0][0] <= now:
            self.settle(now)
        if not self.unstarted:
            return 0.0
        left = self.backlog - (now - self.as_of) / prefill_s
        return (self.tokens if self.tokens < left else left) if left > 0.0 else 0.0

    def start(self, sent: Sent) -> None:
        if not sent.started:
            sent.started = True
            self.tokens -= sent.uncached
            self.unstarted -= 1
            if not self.unstarted:
                self.tokens = 0.0  # no float drift past an empty queue

    def settle(self, now: Seconds) -> None:
        starts = self.starts
        if not starts or starts[0][0] > now:
            return
        while starts and starts[0][0] <= now:
            _, rid = heapq.heappop(starts)
            sent = self.sent.get(rid)
            if sent is not None:
                self.start(sent)
        self.moved()


CONTEXT = 1e-3
"""What a prompt token costs a slotted engine (llama.cpp) beyond one, per token of the
cached context it attends over (``engine.slots.PrefillFit``'s context term): on a quiet
machine a 40-token turn over ~1,000 restored took 0.3-0.6 s where 1,000 cold ones went at
~230 tokens/s (real_engine.py --rate 0.4, /work/coord/re4x): about twice a token."""


def context(book: Book, uncached: float) -> float:
    """The weight of each of a request's ``uncached`` tokens on ``book``'s engine: one plus
    ``CONTEXT`` a token of its cached context, guessed from those ended there: the mean
    prompt less its own (a long uncached prompt is a cold one), at most the mean context
    of those that found one (none where none did: a fleet of cold prompts is unweighed)."""
    cached = book.prompt - uncached
    cached = book.cached if book.cached < cached else cached
    return 1.0 + CONTEXT * cached if cached > 0.0 else 1.0


def ended(book: Book, prompt: int, cached: int) -> None:
    """A request of ``prompt`` tokens, ``cached`` of them found, ended on ``book``'s engine."""
    book.prompt += (prompt - book.prompt) * (0.2 if book.prompt else 1.0)
    if cached > 0:  # the context of those that found one (the first, cold wave's is none)
        book.cached += (cached - book.cached) * (0.2 if book.cached else 1.0)


IDLE_BOOK = Book()
"""No book at all: nothing queued, ``front`` is ``IDLE`` for good (read, never written)."""
