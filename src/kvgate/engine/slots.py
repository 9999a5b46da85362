"""The engine model of a llama.cpp worker: N slots, each holding one prompt's KV.

The paged model of ``engine.blocks`` shares blocks between any sequences, as vLLM
does. llama.cpp does not: each slot keeps the KV of the last prompt it served,
a request reuses only the prefix it shares with its own slot's prompt, and a
slot given to another session loses what it held unless it was saved first
(``/slots/{id}?action=save``, restored later with ``?action=restore``). That is
why the paged model predicted llama.cpp's TTFT 4-9x too low: it let sessions
share a cache that llama.cpp keeps per slot.

Here a prompt is a session and a length (a session's later turn extends its
earlier one, so two prompts of one session share the shorter's length and two of
different sessions share nothing). Costs come from the real engine
(``SlotCosts``): prefill time is linear in the tokens computed, save and restore
are linear in the tokens moved. ``SlotFleet`` replays a sequence of turns in
virtual time, with or without the gateway's offload, one request at a time per
worker (one CPU thread). Pure: no clocks, no I/O.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class PrefillFit:
    """Prefill seconds = ``base_s + per_token_s * tokens computed``."""

    base_s: float
    per_token_s: float

    def seconds(self, tokens: int) -> float:
        """Time to compute ``tokens`` prompt tokens and answer the first token."""
        return self.base_s + self.per_token_s * max(0, tokens)


@dataclass(frozen=True, slots=True)
class SlotCosts:
    """What a llama.cpp worker's actions cost, calibrated from the real engine."""

    prefill: PrefillFit
    save_s: float
    """Seconds per save (the real engine: ~40 ms for 2,300 tokens, ~13 KB per token)."""
    restore_s: float
    """Seconds per restore."""


def fit_prefill(points: Sequence[tuple[int, float]]) -> PrefillFit:
    """Least squares of (tokens computed, seconds) pairs; the base is at least 0."""
    if len(points) < 2:
        raise ValueError("fitting prefill needs at least two points")
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    if intercept < 0:
        return PrefillFit(0.0, float(np.sum(x * y) / np.sum(x * x)))
    return PrefillFit(float(intercept), float(slope))


def predict_returning(
    costs: SlotCosts, prompt_tokens: int, cached_tokens: int, *, restored: bool, saved: bool
) -> float:
    """One turn's TTFT: an optional save of the slot's holder, an optional restore, prefill."""
    seconds = costs.prefill.seconds(prompt_tokens - cached_tokens)
    if restored:
        seconds += costs.restore_s
    if saved:
        seconds += costs.save_s
    return seconds


@dataclass(slots=True)
class _Slot:
    session: str | None = None
    tokens: int = 0
    last_used: float = float("-inf")


@dataclass(slots=True)
class SlotWorkerModel:
    """One llama.cpp worker's slots; ``serve`` says what a turn reuses and costs."""

    slots: int
    costs: SlotCosts
    offload: bool
    disk: dict[str, int] = field(default_factory=dict)
    """Sessions saved to disk and their tokens (shared by a fleet: one folder)."""
    _slots: list[_Slot] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._slots = [_Slot() for _ in range(self.slots)]

    def serve(self, session: str, prompt_tokens: int, now: float) -> tuple[int, float, str]:
        """Serve one turn at ``now``: (cached tokens, seconds of work, KV tier)."""
        mine = [s for s in self._slots if s.session == session]
        seconds = 0.0
        if mine:
            slot, tier = mine[0], "slot"
            cached = min(slot.tokens, prompt_tokens)
        else:
            empty = [s for s in self._slots if s.session is None]
            slot = empty[0] if empty else min(self._slots, key=lambda s: s.last_used)
            if self.offload and slot.session is not None:
                self.disk[slot.session] = slot.tokens
                seconds += self.costs.save_s
            saved = self.disk.pop(session, None) if self.offload else None
            if saved is not None:
                cached, tier = min(saved, prompt_tokens), "disk"
                seconds += self.costs.restore_s
            else:
                cached, tier = 0, "recompute"
        seconds += self.costs.prefill.seconds(prompt_tokens - cached)
        slot.session, slot.tokens, slot.last_used = session, prompt_tokens, now
        return cached, seconds, tier

    def take(self, session: str) -> int | None:
        """Empty ``session``'s slot here, if any (migration saves it); its tokens."""
        for slot in self._slots:
            if slot.session == session:
                slot.session = None
                return slot.tokens
        return None


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """One replayed turn: TTFT in model seconds, cached tokens and tier."""

    session: str
    ttft_s: float
    cached_tokens: int
    prompt_tokens: int
    tier: str


def replay_fleet(
    costs: SlotCosts,
    turns: Sequence[tuple[str, int, int]],
    *,
    workers: int,
    slots: int,
    concurrency: int,
    offload: bool,
) -> list[ModelTurn]:
    """Replay ``(session, prompt tokens, worker index)`` turns in order, in virtual time.

    Like the benchmark's client: at most ``concurrency`` requests at once, each
    session's turns one after another; each worker serves one request at a time
    (a CPU thread), first come first served.
    """
    disk: dict[str, int] = {}
    models = [SlotWorkerModel(slots, costs, offload, disk) for _ in range(workers)]
    free_at = [0.0] * workers
    session_done: dict[str, float] = {}
    running: list[float] = []  # finish times of requests in flight (a heap)
    seq = itertools.count()
    out: list[ModelTurn] = []
    now = 0.0
    for session, prompt, worker in turns:
        if len(running) >= concurrency:
            now = max(now, heapq.heappop(running))
        start = max(now, session_done.get(session, 0.0))
        begin = max(start, free_at[worker])
        moved = 0.0
        if offload:
            # The gateway migrates a session found in another worker's slot: saved there,
            # restored here.
            for i, m in enumerate(models):
                held = m.take(session) if i != worker else None
                if held is not None:
                    disk[session] = held
                    moved = costs.save_s
        cached, work, tier = models[worker].serve(session, prompt, begin + next(seq) * 1e-9)
        if moved and tier == "disk":
            tier = "migrated"
        finish = begin + work + moved
        free_at[worker] = finish
        session_done[session] = finish
        heapq.heappush(running, finish)
        out.append(ModelTurn(session, finish - start, cached, prompt, tier))
    return out
