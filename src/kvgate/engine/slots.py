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
the gateway's offload, through llama.cpp's server loop (``ServerLoop``): one
thread per worker decodes every busy slot's prompt tokens in one batch per
step, so a short turn batched beside another slot's long prefill ends only
when that whole step does; a request, and each of the gateway's save and
restore calls (tasks of the same loop), waits for the running step to end,
and the gateway's calls of one turn go one after the other, so each waits for
a step of the other slots. The workers may share fewer cores than there are
workers (``host_cores``). Pure: no clocks, no I/O.

What it does not know: how much CPU a crowded machine gives the workers at
each moment. Fitted on a calibration wave, ``host_cores`` holds for as long
as the machine's load does.
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

        The seconds are the KV moves (``admit``) and the whole prefill. The slot
        stays busy until ``done(session)``.
        """
        cached, moves, tier = self.admit(session, prompt_tokens, now)
        prefill = self.costs.prefill.seconds(prompt_tokens - cached, cached)
        return cached, sum(moves) + prefill, tier

    def admit(
        self, session: str, prompt_tokens: int, now: float
    ) -> tuple[int, tuple[float, ...], str]:
        """Give one turn an idle slot at ``now``: (cached tokens, its KV moves' seconds, tier).

        The moves, one call each, are the save of the slot's previous holder and
        the restore of this session from disk (offload on); the prefill is the
        caller's.
        """
        idle = [s for s in self._slots if not s.busy]
        if not idle:
            raise RuntimeError("no idle slot: the caller queues turns while all are busy")
        mine = [s for s in idle if s.session == session]
        moves: list[float] = []
        if mine:
            slot, tier = mine[0], "slot"
            cached = min(slot.tokens, prompt_tokens)
        else:
            empty = [s for s in idle if s.session is None]
            slot = empty[0] if empty else min(idle, key=lambda s: s.last_used)
            if self.offload and slot.session is not None:
                self.disk[slot.session] = slot.tokens
                moves.append(self.costs.save_s)
            saved = self.disk.pop(session, None) if self.offload else None
            if saved is not None:
                cached, tier = min(saved, prompt_tokens), "disk"
                moves.append(self.costs.restore_s)
            else:
                cached, tier = 0, "recompute"
        slot.session, slot.tokens, slot.last_used, slot.busy = session, prompt_tokens, now, True
        return cached, tuple(moves), tier

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


@dataclass(frozen=True, slots=True)
class ServerLoop:
    """How llama.cpp's server loop batches its slots (``update_slots``).

    One thread runs the loop. Each step is one ``llama_decode`` of a batch that
    takes prompt tokens from every slot with some left, in slot order, up to
    ``n_batch`` tokens: a slot's turn ends only when the step holding its last
    tokens ends, so a short turn batched beside a long prefill waits for the
    whole step. A request, or a slot save or restore (a task of the same
    loop), that arrives while a step runs waits for it to end. For a model with
    sliding-window layers (Gemma 3) the last ``checkpoint_tail`` tokens of a
    prompt are decoded in a step of their own, so llama.cpp can keep a context
    checkpoint before them.
    """

    n_batch: int = 2048
    checkpoint_tail: int = 64

    def __post_init__(self) -> None:
        if self.n_batch < 1 or self.checkpoint_tail < 0:
            raise ValueError("server loop: n_batch >= 1 and checkpoint_tail >= 0")


LLAMACPP_LOOP = ServerLoop()
"""llama.cpp's defaults (``n_batch`` 2,048) for a sliding-window model such as Gemma 3."""


@dataclass(slots=True)
class _Job:
    turn: int
    session: str
    worker: int
    prompt: int
    sent: float
    cached: int = 0
    tier: str = ""
    moves: list[float] = field(default_factory=list)
    """The turn's save/restore calls, in order: seconds of the loop's time each."""
    done_tokens: int = 0
    """New tokens decoded so far."""


@dataclass(slots=True)
class _Worker:
    model: SlotWorkerModel
    queued: list[_Job] = field(default_factory=list)
    """Turns waiting for an idle slot, first come first served."""
    tasks: list[_Job] = field(default_factory=list)
    """Admitted turns whose next save/restore call the loop has yet to run."""
    arriving: list[_Job] = field(default_factory=list)
    """Turns whose next call (a move, or the prompt) reaches the loop after this step."""
    ready: list[_Job] = field(default_factory=list)
    """Admitted turns with prompt tokens left, in the order they were admitted."""
    step: list[tuple[_Job, int]] | None = None
    """What the loop runs now: a batch of (turn, new tokens), or a task ([(turn, 0)])."""
    left: float = 0.0
    """Seconds of work left in the running step, at full speed."""
    task: bool = False
    """Whether the running step is a turn's KV moves rather than a batch."""


def _chunk_seconds(fit: PrefillFit, job: _Job, tokens: int) -> float:
    """The prefill seconds of a turn's next ``tokens`` new tokens (its fixed part aside).

    Increments of the whole prompt's cost, so a turn's steps add up to
    ``fit.seconds`` of the whole turn less ``base_s``, however it is split.
    """
    before = fit.seconds(job.done_tokens, job.cached)
    return max(0.0, fit.seconds(job.done_tokens + tokens, job.cached) - before)


def _end_step(
    costs: SlotCosts, w: _Worker, now: float, results: dict[int, ModelTurn], busy: set[str]
) -> int:
    """The worker's running step ends at ``now``; how many turns it finished."""
    assert w.step is not None
    finished = 0
    for job, tokens in w.step:
        if w.task:  # one call done: the gateway sends the turn's next one
            w.arriving.append(job)
            continue
        job.done_tokens += tokens
        if job.done_tokens >= job.prompt - job.cached:
            w.ready.remove(job)
            w.model.done(job.session, now)
            busy.discard(job.session)
            ttft = now - job.sent + costs.prefill.base_s
            results[job.turn] = ModelTurn(job.session, ttft, job.cached, job.prompt, job.tier)
            finished += 1
    w.step, w.left, w.task = None, 0.0, False
    return finished


def _next_step(costs: SlotCosts, loop: ServerLoop, w: _Worker) -> None:
    """Start the loop's next step on an idle worker: a pending task first, then a batch."""
    if w.tasks:
        job = w.tasks.pop(0)
        w.step, w.left, w.task = [(job, 0)], job.moves.pop(0), True
        return
    budget, batch, seconds = loop.n_batch, [], 0.0
    for job in w.ready:
        if budget <= 0:
            break
        left = job.prompt - job.cached - job.done_tokens
        # The checkpoint tail waits for a step of its own, however the rest was split.
        take = min(left - loop.checkpoint_tail if left > loop.checkpoint_tail else left, budget)
        seconds += _chunk_seconds(costs.prefill, job, take)
        batch.append((job, take))
        budget -= take
    if batch:
        w.step, w.left = batch, seconds


def _take_calls(costs: SlotCosts, fleet: list[_Worker], w: int, now: float) -> None:
    """Worker ``w``'s loop takes the calls that reached it: turns' next calls, new turns.

    A new turn gets an idle slot (else it waits, first come first served);
    with offload its save/restore calls come first, and a session in another
    worker's slot is migrated: saved from there first (run, like every call of
    the turn, on this worker's loop).
    """
    state = fleet[w]
    for job in state.arriving:
        (state.tasks if job.moves else state.ready).append(job)
    state.arriving.clear()
    while state.queued and state.model.idle_slots():
        job = state.queued.pop(0)
        if state.model.offload:
            for i, other in enumerate(fleet):
                held_tokens = other.model.take(job.session) if i != w else None
                if held_tokens is not None:
                    state.model.disk[job.session] = held_tokens
                    job.moves.append(costs.save_s)
        migrated = bool(job.moves)
        job.cached, moves, job.tier = state.model.admit(job.session, job.prompt, now)
        job.moves.extend(moves)
        if migrated and job.tier == "disk":
            job.tier = "migrated"
        (state.tasks if job.moves else state.ready).append(job)


def replay_fleet(
    costs: SlotCosts,
    turns: Sequence[tuple[str, int, int]],
    *,
    workers: int,
    slots: int,
    concurrency: int,
    offload: bool,
    host_cores: float | None = None,
    loop: ServerLoop = LLAMACPP_LOOP,
) -> list[ModelTurn]:
    """Replay ``(session, prompt tokens, worker index)`` turns in virtual time.

    Like the benchmark's client: turns take one of ``concurrency`` permits in
    the order given (the order they are sent), then wait for their session's
    previous turn; a worker gives a turn an idle slot (or queues it, first
    come first served) and runs llama.cpp's server loop (``ServerLoop``): the
    turn's save/restore as a task of the loop, then its prompt in batched
    steps with the other busy slots'. A turn's TTFT runs from when it is sent
    to the end of the step holding its last prompt token, plus the prefill's
    fixed part (``base_s``: the request's own overhead, outside the loop).

    ``host_cores``: the CPU the workers' threads share (None: each has its own
    core). While more workers run a step than that, each runs at ``host_cores
    / busy workers`` of its speed, as single-threaded llama.cpp workers on one
    crowded machine do.
    """
    if host_cores is not None and host_cores <= 0:
        raise ValueError("host_cores must be positive")
    disk: dict[str, int] = {}  # one folder for the fleet
    fleet = [_Worker(SlotWorkerModel(slots, costs, offload, disk)) for _ in range(workers)]
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
            fleet[worker].queued.append(_Job(index, session, worker, prompt, now))
        for w, state in enumerate(fleet):
            if state.step is None:  # the loop takes calls between steps
                _next_step(costs, loop, state)  # what was there before this instant
                _take_calls(costs, fleet, w, now)
                if state.step is None:  # an idle loop starts at once on what came
                    _next_step(costs, loop, state)
        running = [state for state in fleet if state.step is not None]
        if not running:
            raise RuntimeError("replay stalled: nothing runs and nothing can start")
        speed = (
            1.0 if host_cores is None or len(running) <= host_cores else host_cores / len(running)
        )
        step = min(state.left for state in running) / speed
        now += step
        for state in running:
            state.left -= step * speed
            if state.left <= 1e-12:
                permits += _end_step(costs, state, now, results, busy_sessions)
    return [results[i] for i in range(len(turns))]
