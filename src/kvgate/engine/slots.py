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

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class PrefillFit:
    """Prefill seconds: a fixed part, a part per token computed, and a part per
    attention pair (each new token attends to the cached context and to the new
    tokens before it), which is why a long prompt costs more per token."""

    base_s: float
    per_token_s: float
    per_pair_s: float = 0.0

    def seconds(self, tokens: int, context: int = 0) -> float:
        """Time to compute ``tokens`` prompt tokens after ``context`` cached ones."""
        n = max(0, tokens)
        return self.base_s + self.per_token_s * n + self.per_pair_s * _pairs(n, context)


def _pairs(tokens: int, context: int) -> float:
    return tokens * context + tokens * tokens / 2


@dataclass(frozen=True, slots=True)
class SlotCosts:
    """What a llama.cpp worker's actions cost, calibrated from the real engine."""

    prefill: PrefillFit
    save_s: float
    """Seconds per save (the real engine: ~40 ms for 2,300 tokens, ~13 KB per token)."""
    restore_s: float
    """Seconds per restore."""


def fit_prefill(points: Sequence[tuple[int, float]]) -> PrefillFit:
    """Least squares of cold (tokens, seconds) pairs with every term at least 0.

    Non-negative least squares by trying each subset of the three terms (fixed,
    per token, per attention pair) and keeping the best fit with no negative term.
    """
    if len(points) < 2:
        raise ValueError("fitting prefill needs at least two points")
    n = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    columns = (np.ones_like(n), n, n * n / 2)
    best: tuple[float, list[float]] | None = None
    for subset in ((0, 1, 2), (1, 2), (0, 1), (1,), (0, 2), (2,)):
        design = np.column_stack([columns[k] for k in subset])
        coef = np.linalg.lstsq(design, y, rcond=None)[0]
        if (coef < 0).any():
            continue
        error = float(np.sum((design @ coef - y) ** 2))
        if best is None or error < best[0] - 1e-12:
            full = [0.0, 0.0, 0.0]
            for k, c in zip(subset, coef, strict=True):
                full[k] = float(c)
            best = (error, full)
    if best is None:
        raise ValueError("no non-negative prefill fit (times falling with tokens?)")
    base, per_token, per_pair = best[1]
    return PrefillFit(base, per_token, per_pair)


def predict_returning(
    costs: SlotCosts, prompt_tokens: int, cached_tokens: int, *, restored: bool, saved: bool
) -> float:
    """One turn's TTFT: an optional save of the slot's holder, an optional restore, prefill."""
    seconds = costs.prefill.seconds(prompt_tokens - cached_tokens, cached_tokens)
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
    busy: bool = False


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

    def idle_slots(self) -> int:
        """Slots not serving a request now."""
        return sum(1 for s in self._slots if not s.busy)

    def serve(self, session: str, prompt_tokens: int, now: float) -> tuple[int, float, str]:
        """Start one turn at ``now`` in an idle slot: (cached tokens, seconds of work, tier).

        The slot stays busy until ``done(session)``.
        """
        idle = [s for s in self._slots if not s.busy]
        if not idle:
            raise RuntimeError("no idle slot: the caller queues turns while all are busy")
        mine = [s for s in idle if s.session == session]
        seconds = 0.0
        if mine:
            slot, tier = mine[0], "slot"
            cached = min(slot.tokens, prompt_tokens)
        else:
            empty = [s for s in idle if s.session is None]
            slot = empty[0] if empty else min(idle, key=lambda s: s.last_used)
            if self.offload and slot.session is not None:
                self.disk[slot.session] = slot.tokens
                seconds += self.costs.save_s
            saved = self.disk.pop(session, None) if self.offload else None
            if saved is not None:
                cached, tier = min(saved, prompt_tokens), "disk"
                seconds += self.costs.restore_s
            else:
                cached, tier = 0, "recompute"
        seconds += self.costs.prefill.seconds(prompt_tokens - cached, cached)
        slot.session, slot.tokens, slot.last_used, slot.busy = session, prompt_tokens, now, True
        return cached, seconds, tier

    def done(self, session: str, now: float) -> None:
        """``session``'s turn ended at ``now``: its slot is idle again (and keeps its KV)."""
        for slot in self._slots:
            if slot.busy and slot.session == session:
                slot.busy, slot.last_used = False, now
                return

    def take(self, session: str) -> int | None:
        """Empty ``session``'s slot here, if any (migration saves it); its tokens."""
        for slot in self._slots:
            if slot.session == session and not slot.busy:
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


@dataclass(slots=True)
class _Job:
    turn: int
    session: str
    worker: int
    prompt: int
    sent: float
    work: float = 0.0
    cached: int = 0
    tier: str = ""


def replay_fleet(
    costs: SlotCosts,
    turns: Sequence[tuple[str, int, int]],
    *,
    workers: int,
    slots: int,
    concurrency: int,
    offload: bool,
) -> list[ModelTurn]:
    """Replay ``(session, prompt tokens, worker index)`` turns in virtual time.

    Like the benchmark's client: turns take one of ``concurrency`` permits in
    order, then wait for their session's previous turn; a worker serves up to
    ``slots`` turns at once, sharing its one CPU thread equally among them
    (llama.cpp batches its busy slots), and queues the rest first come first
    served. A turn's TTFT runs from when it is sent to when its work is done.
    """
    disk: dict[str, int] = {}
    models = [SlotWorkerModel(slots, costs, offload, disk) for _ in range(workers)]
    active: list[list[_Job]] = [[] for _ in range(workers)]
    queued: list[list[_Job]] = [[] for _ in range(workers)]
    holding: list[tuple[int, str, int, int]] = []  # permit holders not yet sent
    busy_sessions: set[str] = set()
    results: dict[int, ModelTurn] = {}
    permits, next_turn, now = concurrency, 0, 0.0
    while len(results) < len(turns):
        while permits and next_turn < len(turns):
            session, prompt, worker = turns[next_turn]
            holding.append((next_turn, session, prompt, worker))
            permits, next_turn = permits - 1, next_turn + 1
        for held in list(holding):
            index, session, prompt, worker = held
            if session in busy_sessions:
                continue
            holding.remove(held)
            busy_sessions.add(session)
            queued[worker].append(_Job(index, session, worker, prompt, now))
        for w in range(workers):
            while queued[w] and models[w].idle_slots():
                job = queued[w].pop(0)
                moved = 0.0
                if offload:
                    # A session in another worker's slot is migrated: saved there first.
                    for i, m in enumerate(models):
                        held_tokens = m.take(job.session) if i != w else None
                        if held_tokens is not None:
                            disk[job.session], moved = held_tokens, costs.save_s
                job.cached, job.work, job.tier = models[w].serve(job.session, job.prompt, now)
                job.work += moved
                if moved and job.tier == "disk":
                    job.tier = "migrated"
                job.work = max(job.work, 1e-9)
                active[w].append(job)
        step = min(
            (min(j.work for j in jobs) * len(jobs) for jobs in active if jobs),
            default=None,
        )
        if step is None:
            raise RuntimeError("replay stalled: nothing runs and nothing can start")
        now += step
        for w, jobs in enumerate(active):
            if not jobs:
                continue
            share = step / len(jobs)
            for job in list(jobs):
                job.work -= share
                if job.work <= 1e-12:
                    jobs.remove(job)
                    models[w].done(job.session, now)
                    busy_sessions.discard(job.session)
                    permits += 1
                    results[job.turn] = ModelTurn(
                        job.session, now - job.sent, job.cached, job.prompt, job.tier
                    )
    return [results[i] for i in range(len(turns))]
