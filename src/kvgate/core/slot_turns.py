"""What a llama.cpp worker will compute of a request, in the engine's own tokens.

The slot plane (``gateway.control.offload``) knows where each session's KV is (``SlotMap``)
and, from each turn's ``usage``, how many tokens it left there: a slot keeps the prompt it
served and the reply it generated (all but the last token, never fed back), a saved slot
the prompt (restored, a turn finds that much: real_engine.py, 2026-12-07). A session's next
turn re-sends its last prompt and reply and adds its new message, so the engine computes
about its new characters at the session's own characters a token (its last prompt's:
``prompt_chars / prompt_tokens``), plus whatever of the reply the KV it finds lacks::

    uncached = last prompt tokens + (prompt chars - last prompt chars) / its chars a token
               - tokens held where it lands (slot: prompt + reply - 1; restored: prompt)

Guessed from the prompt's characters against the index's blocks instead (the policies'
``chars_per_token`` of 4, a block of 256 characters), a later turn over ~1,100 cached
tokens was booked at 0-40 uncached tokens where it computed 40-270 (TTFT predicted 2-10x
short). A request of no session the plane knows (a new one) computes its prompt less what
a slot shares with it (``SlotMap.shares``: whole blocks), at the fleet's measured
characters a token. What neither sees (the chat template's tokens around each message, a
reply tokenized again, a share's part past its last whole block) is measured: each turn's
usage against what was said of it (``observed``) moves a correction in tokens, one for
turns whose KV the plane held and one for the rest. And the time the plane takes before
the engine has the request (saving a slot's holder, restoring a session's or a seed's
file: ``prepared``) is measured, per what it finds there (its own slot, its KV moved, a new
session's slot), and told beside: on a quiet CPU a restore cost more than a short turn's
prefill (0.15-0.25 s against 0.3). Pure: no clock, no I/O; bounded (the last ``limit``
sessions).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvgate.types import SessionKey, WorkerId

_MISSES = 16
"""Turns whose misses the correction is the median of, per kind, once there are three:
what it is for is a few dozen tokens (a template, a share's partial block), and one miss
can be far off (a restore that failed; a first turn's long code answer: -119, which as a
running mean's first sample booked the next turns at 0 where they computed 40)."""


@dataclass(frozen=True, slots=True)
class LastTurn:
    """A session's last turn as its usage reported it."""

    worker: WorkerId
    chars: int  # its prompt's characters (``RequestFeatures.prompt_chars``)
    prompt: int  # its prompt's tokens
    reply: int  # the tokens it generated

    @property
    def per_token(self) -> float:
        """Characters a token of this session's prompt."""
        return self.chars / self.prompt


class SlotTurns:
    """Each session's last turn on a llama.cpp worker, and the fleet's characters a token."""

    __slots__ = ("_last", "_misses", "bias", "limit", "per_token", "setup")

    def __init__(self, limit: int = 65_536) -> None:
        self.limit = limit
        self._last: OrderedDict[SessionKey, LastTurn] = OrderedDict()
        self.per_token = 0.0
        """The fleet's characters a prompt token, averaged over turns (0: none seen yet)."""
        self.bias = [0.0, 0.0]
        """Tokens added to what is said of a turn (``uncached``): [held KV, the rest]."""
        self._misses: list[deque[float]] = [deque(maxlen=_MISSES), deque(maxlen=_MISSES)]
        self.setup = [0.0, 0.0, 0.0]
        """Mean seconds before the engine has a turn: [in its own slot, moved, new]."""

    def ended(
        self, key: SessionKey | None, worker: WorkerId, chars: int, prompt: int, reply: int
    ) -> None:
        """A turn of ``chars`` characters ended on ``worker`` with this usage."""
        if prompt <= 0 or chars <= 0:
            return
        ratio = chars / prompt
        self.per_token += (ratio - self.per_token) * (0.1 if self.per_token else 1.0)
        if key is None:
            return
        last = self._last
        last[key] = LastTurn(worker, chars, prompt, max(reply, 0))
        last.move_to_end(key)
        if len(last) > self.limit:
            last.popitem(last=False)

    def observed(self, held: bool, said: float, computed: int) -> None:
        """A turn said to compute ``said`` tokens (``uncached``, its KV ``held`` in a slot or
        saved, the correction included) computed ``computed``: the correction is the median
        of the latest misses of the count alone, once there are three."""
        kind = 0 if held else 1
        misses = self._misses[kind]
        misses.append(computed - said + self.bias[kind])
        self.bias[kind] = statistics.median(misses) if len(misses) >= 3 else 0.0

    def prepared(self, kind: int, seconds: float) -> None:
        """A turn of ``kind`` (``setup``'s index) took ``seconds`` before it was sent."""
        self.setup[kind] += (seconds - self.setup[kind]) * 0.2

    def uncached(
        self,
        key: SessionKey | None,
        chars: int,
        workers: Sequence[WorkerId],
        *,
        slot: WorkerId | None,
        saved: bool,
        shared: Callable[[WorkerId], int],
    ) -> tuple[tuple[WorkerId, int, float], ...]:
        """Per worker of ``workers``, the tokens of a prompt of ``chars`` characters the
        engine computes there and the seconds before it has them (module docs); empty
        while no turn has been seen.

        ``slot``: the worker whose slot holds ``key``'s KV; ``saved``: it is on disk (any
        worker restores it); ``shared(worker)``: the characters a slot there shares with
        the prompt otherwise (a new session's, or one whose KV is gone)."""
        turn = self._last.get(key) if key is not None else None
        if turn is not None:
            per_token = turn.per_token
            tokens = turn.prompt + (chars - turn.chars) / per_token
        elif self.per_token:
            per_token = self.per_token
            tokens = chars / per_token
        else:
            return ()
        out, kept = [], turn is not None and (slot is not None or saved)
        bias, setup = self.bias[0 if kept else 1], self.setup
        for worker in workers:
            if turn is not None and kept:
                held: float = turn.prompt + (turn.reply - 1 if worker == slot and turn.reply else 0)
            else:
                held = min(shared(worker), chars) / per_token
            kind = self.kind(kept=kept, here=worker == slot)
            out.append((worker, max(round(tokens - held + bias), 0), setup[kind]))
        return tuple(out)

    @staticmethod
    def kind(*, kept: bool, here: bool) -> int:
        """``setup``'s index of a turn: its KV in its slot here (0), moved here (1), new (2)."""
        return (0 if here else 1) if kept else 2
