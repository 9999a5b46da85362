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
(``SlotCosts``, fitted by ``fit_prefill`` on measured turns):

- prefill: a fixed part, a part per new token, a part per causal pair among the
  new tokens, and a part per (new token x cached token it attends to) pair. The
  last is what a short turn after a long cached context pays (llama.cpp reads
  the whole cached KV for every new token, several times a cold prompt's cost
  per pair); a calibration on cold prompts alone cannot see it, so the fit
  takes warm turns too. Which cached tokens a new token attends to follows the
  model (``Attention``: Gemma 3 attends within a 512-token window in 5 of 6
  layers);
- save and restore: the gateway's measured mean per action (``SlotCosts``), or
  per token (``engine.slotio.SlotIo``, what the emulated worker answers with).

``replay_fleet`` replays a sequence of turns in virtual time, with or without
the gateway's offload: a worker's busy slots share its one CPU thread, and the
workers may share fewer cores than there are workers (``host_cores``). Pure:
no clocks, no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Attention:
    """How much of a cached context one new token attends to, over the model's layers.

    ``local_share`` of the layers use a sliding window of ``window`` tokens (Gemma 3:
    5 of every 6 layers, a 512-token window in the 270M model, as its GGUF says);
    the rest attend to the whole context. By default every layer is global.
    """

    window: int = 0
    local_share: float = 0.0

    def __post_init__(self) -> None:
        if self.window < 0 or not 0.0 <= self.local_share <= 1.0:
            raise ValueError("attention: window >= 0 and 0 <= local_share <= 1")

    def seen(self, context: int) -> float:
        """Cached tokens one new token attends to, averaged over the layers."""
        ctx = max(0, context)
        if not self.window:
            return float(ctx)
        return (1 - self.local_share) * ctx + self.local_share * min(ctx, self.window)


GEMMA3_270M = Attention(window=512, local_share=5 / 6)
"""Gemma 3 270M: 18 layers, 5 of 6 with a 512-token sliding window (the real engine's)."""


@dataclass(frozen=True, slots=True)
class PrefillFit:
    """Prefill seconds: a fixed part, a part per token computed, a part per causal
    pair among the new tokens, and a part per (new token x cached token) pair.

    The two attention terms are kept apart because llama.cpp does not pay them
    alike: a cold prompt computes its pairs in large batched products, while a
    few new tokens after a long cached context read the whole cached KV for
    every layer (memory-bound), which costs far more per pair. A calibration on
    cold prompts alone cannot see the second term; fit on warm turns too.
    """

    base_s: float
    per_token_s: float
    per_pair_s: float = 0.0
    """Per causal pair among the new tokens (``tokens**2 / 2`` of them)."""
    per_cached_pair_s: float = 0.0
    """Per pair of a new token and a cached context token it attends to."""
    attention: Attention = field(default_factory=Attention)
    """Which cached tokens a new token attends to (sliding-window layers see fewer)."""

    def seconds(self, tokens: int, context: int = 0) -> float:
        """Time to compute ``tokens`` prompt tokens after ``context`` cached ones."""
        n = max(0, tokens)
        return (
            self.base_s
            + self.per_token_s * n
            + self.per_pair_s * n * n / 2
            + self.per_cached_pair_s * n * self.attention.seen(context)
        )


@dataclass(frozen=True, slots=True)
class PrefillSample:
    """One measured prefill: new tokens computed after ``context`` cached ones, seconds."""

    tokens: int
    context: int
    seconds: float


@dataclass(frozen=True, slots=True)
class SlotCosts:
    """What a llama.cpp worker's actions cost, calibrated from the real engine."""

    prefill: PrefillFit
    save_s: float
    """Seconds per save (the real engine: ~40 ms for 2,300 tokens, ~13 KB per token)."""
    restore_s: float
    """Seconds per restore."""


def fit_prefill(
    samples: Sequence[PrefillSample], attention: Attention | None = None, *, tied: bool = False
) -> PrefillFit:
    """Non-negative least squares of measured prefills on the four terms of ``PrefillFit``.

    Each sample is weighted by its inverse time, so what is minimised is the
    relative error (a 1 s turn counts as much as a 90 s prefill: the model is
    judged by its relative error). Exact NNLS by trying each subset of the terms
    and keeping the best fit with no negative coefficient. A term the samples
    cannot see (no warm sample: no cached pairs) comes out 0. ``tied`` fits one
    coefficient for both attention terms (the model before issue 16: every pair
    costs alike, which a calibration on cold prompts then sets).
    """
    if len(samples) < 2:
        raise ValueError("fitting prefill needs at least two samples")
    n = np.array([s.tokens for s in samples], dtype=float)
    ctx = np.array([s.context for s in samples], dtype=float)
    y = np.array([s.seconds for s in samples], dtype=float)
    if (y <= 0).any():
        raise ValueError("prefill samples need positive seconds")
    weight = 1.0 / y
    att = attention if attention is not None else Attention()
    seen = np.array([att.seen(int(c)) for c in ctx], dtype=float)
    columns: tuple[np.ndarray, ...] = (np.ones_like(n), n, n * n / 2, n * seen)
    if tied:
        columns = (columns[0], columns[1], columns[2] + columns[3])
    best: tuple[float, list[float]] | None = None
    for size in range(1, len(columns) + 1):  # fewer terms first: they win ties
        for subset in itertools.combinations(range(len(columns)), size):
            design = np.column_stack([columns[k] for k in subset])
            if not design.any(axis=0).all():
                continue  # a term no sample has
            coef = np.linalg.lstsq(design * weight[:, None], y * weight, rcond=None)[0]
            if (coef < 0).any():
                continue
            error = float(np.sum(((design @ coef - y) * weight) ** 2))
            if best is None or error < best[0] - 1e-12:
                full = [0.0] * len(columns)
                for k, c in zip(subset, coef, strict=True):
                    full[k] = float(c)
                best = (error, full)
    if best is None:
        raise ValueError("no non-negative prefill fit (times falling with tokens?)")
    if tied:
        best[1].append(best[1][2])
    base, per_token, per_pair, per_cached_pair = best[1]
    return PrefillFit(base, per_token, per_pair, per_cached_pair, att)


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
    host_cores: float | None = None,
) -> list[ModelTurn]:
    """Replay ``(session, prompt tokens, worker index)`` turns in virtual time.

    Like the benchmark's client: turns take one of ``concurrency`` permits in
    order, then wait for their session's previous turn; a worker serves up to
    ``slots`` turns at once, sharing its one CPU thread equally among them
    (llama.cpp batches its busy slots), and queues the rest first come first
    served. A turn's TTFT runs from when it is sent to when its work is done.

    ``host_cores``: the CPU the workers' threads share (None: each has its own
    core). While more workers are busy than that, each runs at ``host_cores /
    busy workers`` of its speed, as single-threaded llama.cpp workers on one
    crowded machine do.
    """
    if host_cores is not None and host_cores <= 0:
        raise ValueError("host_cores must be positive")
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
        busy = sum(1 for jobs in active if jobs)
        speed = 1.0 if host_cores is None or busy <= host_cores else host_cores / busy
        step = min(
            (min(j.work for j in jobs) * len(jobs) / speed for jobs in active if jobs),
            default=None,
        )
        if step is None:
            raise RuntimeError("replay stalled: nothing runs and nothing can start")
        now += step
        for w, jobs in enumerate(active):
            if not jobs:
                continue
            share = step * speed / len(jobs)
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
