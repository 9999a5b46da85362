"""The simulated clients: a workload's requests in arrival order, as the live replay sends them.

A client cannot send a conversation's next turn before the previous turn's reply
came back: the reply is part of the next prompt. The live replay
(``kvgate.bench.replay``) therefore holds a turn that re-sends a reply until the
request that produces it has ended (answered or refused), and sends it then if
its own arrival has passed. ``Arrivals`` does the same in virtual time, so the
simulator's later turns come when the live benchmark's do: after their previous
turn, never before it (``turns_wait``; off, every request comes at its arrival,
an open loop in which a later turn can find its context not yet computed).

A turn is linked to its previous one by the reply segment it re-sends, exactly as
the live replay links them, so only turns whose prompt carries a reply wait.

With ``concurrency`` the clients have as many requests out at most, as the live
replay's does (``BenchClient.concurrency``): a request due while that many are out
waits, first come first served, and is sent when one ends. An overloaded fleet then
meets a queue at the clients, not an open loop that piles up at the gateway until it
sheds (on the trace's overloaded seed 191 live kvgate shed 116 of 600 behind a cap of
64; the simulator without one, more).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from kvgate.types import Seconds
from kvgate.workload.request import SimRequest, previous_turn


class Arrivals:
    """The next request to reach the gateway, a later turn held until its previous one ended."""

    __slots__ = ("_blocked", "_head", "_open", "_order", "_out", "_released", "_replies",
                 "_slotted", "_stream", "_waiting", "concurrency", "held", "queued",
                 "turns_wait")  # fmt: skip

    def __init__(
        self,
        requests: Iterator[SimRequest],
        *,
        turns_wait: bool = True,
        concurrency: int | None = None,
    ) -> None:
        if concurrency is not None and concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._stream = requests
        self._head = next(requests, None)
        self.turns_wait = turns_wait
        self.concurrency = concurrency
        self._out = 0  # requests sent and not ended
        self._blocked: deque[SimRequest] = deque()  # due while ``concurrency`` were out
        self._slotted: set[str] = set()  # released from ``_blocked`` with an ended one's slot
        self.queued = 0
        """Requests that were due while ``concurrency`` were out, and waited for a slot."""
        # Turns released when their previous turn ended: (arrival, order, request).
        self._released: list[tuple[Seconds, int, SimRequest]] = []
        self._order = itertools.count()
        self._open: dict[int, str] = {}  # reply segment -> the unended request making it
        self._replies: dict[str, int] = {}  # that request -> its reply segment
        self._waiting: dict[str, SimRequest] = {}  # an unended request -> its next turn
        self.held = 0
        """Turns that arrived before their previous turn ended, and waited for it."""

    @property
    def upcoming(self) -> SimRequest | None:
        """The request due next (it may yet be held when taken), or ``None``: none now."""
        return self._released[0][2] if self._released_first() else self._head

    @property
    def waiting(self) -> int:
        """Turns held now, waiting for their previous turn to end."""
        return len(self._waiting)

    @property
    def releasable(self) -> bool:
        """Whether a request's end would release one now (a held turn, or one due past the
        concurrency cap): its arrival is then any end's, not ``upcoming``'s."""
        return bool(self._waiting or self._blocked)

    def take(self) -> SimRequest | None:
        """Remove the upcoming request and return it, or ``None`` if it must wait
        for its previous turn (it comes back, at that turn's end, through ``ended``)."""
        head = self._head
        if self._released_first():
            request = heapq.heappop(self._released)[2]
            if request.request_id in self._slotted:
                self._slotted.discard(request.request_id)  # an ended request's slot
                return request
        elif head is not None:
            request = head
            self._head = next(self._stream, None)
            if self.turns_wait:
                previous = previous_turn(request, self._open)
                if request.reply is not None:
                    # Its next turn waits for it from now on, whether or not it waits itself.
                    self._open[request.reply[0]] = request.request_id
                    self._replies[request.request_id] = request.reply[0]
                if previous is not None:
                    self._waiting[previous] = request
                    self.held += 1
                    return None
        else:
            return None
        if self.concurrency is not None:
            if self._out >= self.concurrency:
                self._blocked.append(request)
                self.queued += 1
                return None
            self._out += 1
        return request

    def ended(self, request_id: str, now: Seconds) -> None:
        """A request was answered or refused at ``now``: its next turn may come."""
        reply = self._replies.pop(request_id, None)
        if reply is not None:
            self._open.pop(reply, None)
        after = self._waiting.pop(request_id, None)
        if after is not None:
            late = dataclasses.replace(after, arrival=now)
            heapq.heappush(self._released, (now, next(self._order), late))
        if self.concurrency is not None:
            if self._blocked:  # its slot goes to the first request waiting for one
                sent = dataclasses.replace(self._blocked.popleft(), arrival=now)
                self._slotted.add(sent.request_id)
                heapq.heappush(self._released, (now, next(self._order), sent))
            else:
                self._out -= 1

    def _released_first(self) -> bool:
        """Whether a released turn comes before the workload's next request."""
        head, released = self._head, self._released
        return bool(released) and (head is None or released[0][0] < head.arrival)
