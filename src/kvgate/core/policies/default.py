"""``default``: sessions stick; new work goes where its first token comes soonest.

A request with a session id stays on its bound worker while that one is routable, not
under hard pressure and under ``threshold`` (``affinity_hit``); otherwise, and for every
headerless request, the placement minimises, over the candidate workers, in seconds::

    cost = queued prefill + uncached prefill + in flight × decode_s
           + evict × max(uncached prefill, life) × fill − stay × cached prefill × (1 − fill)

- *queued prefill*: what was routed there and not yet prefilled, at most what its requests
  not yet at their first token bring (``core.speed``'s book, drained at the prior's rate);
  on an engine of a few slots (llama.cpp) at least the TTFT ``core.speed`` predicts there;
- *uncached prefill*: the prompt less the worker's longest match (``IndexResidency``: KV
  events, this replica's index, the store's holders; KV restorable from disk at
  ``restorable_credit``), a claim the index cannot vouch for at the share usage confirms
  (``ClaimShares``), a later headerless turn's match to its earlier turn's end and reply
  (``Lives``), none in a cold llama.cpp slot;
- *fill*: how full the worker's KV is with what was sent there lately (``Warming._charge``);
  *life*: a new session, or a headerless request extending no earlier chain, decides
  where its whole conversation goes and is charged what one routes over its life
  (``Lives``);
- *stay*: a cache's pull on one-shot work, not for a session (its later turns follow it).

Rates are the prior's (``prefill_tokens_per_s``, or the engines' own where they report
one), in the driver's clock (``time_scale``). Pressure turns away new sessions only
(the KV gate holds a request whose KV does not fit yet); idle workers get shared
prefixes copied ahead (``Warming``). A migrated session is bound where it goes
(``affinity_{overloaded,lost,pressure,version}_migrated``); a headerless request is
never bound. Reasons: ``prefix_match``, ``least_ttft`` (a colder worker won),
``least_loaded`` (nothing cached anywhere), ``restorable_match``. Why each term is
there: ``docs/dev/default.md`` and ``docs/runs/ablation_default.json``.

Example (every option is ``DefaultConfig``'s)::

    policy: default
    options: {threshold: 0.8, prefill_tokens_per_s: 12000, decode_s: 0.002, stay: 0.5, evict: 1.0}
"""

from __future__ import annotations

import math
from collections.abc import Container
from typing import Literal

from pydantic import Field, field_validator

from kvgate.core.decision import CAPACITY_FULL, Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import WorkerState
from kvgate.core.policies.base import (
    Holding,
    Scored,
    ThresholdKind,
    affinity_status,
    candidates,
    refuse,
    route,
    under_threshold,
)
from kvgate.core.policies.claims import LRU_TURNOVER, ClaimShares
from kvgate.core.policies.learning import CostConfig
from kvgate.core.policies.lives import Lives, Through
from kvgate.core.policies.warming import Openers, Warming
from kvgate.core.policy import RouteContext
from kvgate.core.prefix_index import PrefixIndexConfig
from kvgate.core.speed import IDLE_BOOK, FleetSpeed, Speed
from kvgate.types import Seconds, WorkerId

__all__ = ["DefaultConfig", "DefaultPolicy"]

Term = Literal["session_life", "chain_life", "tail", "claims", "running", "holding"]
"""A term ``DefaultConfig.off`` can switch off (the module docs)."""


class DefaultConfig(CostConfig):
    """Options of ``default``: session stickiness and the expected-TTFT cost model."""

    threshold_kind: ThresholdKind = "fraction"
    threshold: float = Field(default=0.8, gt=0)
    decode_s: float = Field(default=0.002, ge=0)
    """Time to first token each request already on a worker adds (its decode steps)."""
    stay: float = Field(default=0.5, ge=0)
    """The pull of a warm worker, as a fraction of the prefill seconds its cache saves."""
    recent_half_life_s: float = Field(default=60.0, gt=0)
    """Half-life of the per-worker count of recently routed requests (a tie-break), of
    the counts that measure what a conversation brings over its life, and of the tokens
    sent to a worker that bound the fill it is charged (``FleetSpeed.lately``)."""
    chain_ends: int = Field(default=65_536, ge=1)
    """Ends of recently routed headerless chains remembered, to tell a conversation's
    later turn (its chain runs through one) from a request that opens one."""
    warm_min_blocks: int = Field(default=4, ge=0)
    """Warm shared prefixes of at least this many index blocks (4: 256 tokens) ahead on an
    idle worker, where the next opening behind them would copy them (``core.warmup``; a
    prefix is shared once two openings matched it, ``core.policies.warming``; 0: never)."""
    index: PrefixIndexConfig = PrefixIndexConfig()
    off: frozenset[Term] = frozenset()
    """Terms switched off that no neutral value of a weight above switches off, for the
    ablation (``benchmarks/ablation.py --baseline default``); ``a+b`` from a string."""

    @field_validator("off", mode="before")
    @classmethod
    def _terms(cls, value: object) -> object:
        return frozenset(filter(None, value.split("+"))) if isinstance(value, str) else value


_Cuts = dict[WorkerId, tuple[int, int]]  # per worker: blocks (young, resident) of a claim

_EVERY = Holding({}, 0)  # every worker holds 0 blocks or more (``DefaultPolicy._holding``)


class DefaultPolicy(Warming):
    """Sticky explicit sessions; everything else placed by expected time to first token."""

    name = "default"

    def __init__(self, config: DefaultConfig | None = None) -> None:
        self.config = config if config is not None else DefaultConfig()
        super().__init__(self.config.index)  # the index, the chains in flight, the replies
        cfg = self.config
        self._off = cfg.off  # terms switched off (the ablation)
        # The model's rates and times, in the driver's clock (an engine's own TTFT too).
        scale = self.engine_seconds = cfg.time_scale
        self._rate = cfg.prefill_tokens_per_s * scale
        self._decode_s = cfg.decode_s / scale
        self._recent_half_s = half_s = cfg.recent_half_life_s / scale
        pending = cfg.index.max_pending
        prior = Speed(0.0, 1.0 / self._rate, self._decode_s)
        self.speed = FleetSpeed(prior, max_pending=pending, at_prior=True, half_s=half_s)
        self._fills, self.charged, self._aged_at = {}, {}, -math.inf  # ``Warming._charge``
        # Where headerless requests ended; what a conversation routes over its life.
        self._lives = Lives(self.index.depth_chars, cfg.chain_ends, half_s=half_s)
        self._trust = ClaimShares(max_pending=pending)
        self._openers = Openers(cfg.warm_min_blocks)
        # What a placement remembers for ``on_routed`` (request id first): whether it
        # opened a conversation (``Lives.through``); per worker the blocks claimed and
        # their (young, resident) cuts (``_cuts``); the end its chain ran through: the
        # worker its earlier turn went to, the blocks to that turn's last whole one, and
        # its reach. ``_probing``: ``_place`` runs for a warm-up's probe, not a request.
        self._opened: tuple[str, Through | None] = ("", None)
        self._claims: tuple[str, dict[WorkerId, int], _Cuts] = ("", {}, {})
        self._tail: tuple[str, WorkerId, int, int] = ("", WorkerId(""), 0, 0)
        self._probing = False
        self._scored = Scored([], [])  # the last placement's costs (``hold_worth``)

    # -- learning -----------------------------------------------------------------

    def queued_tokens(self, worker: WorkerId, now: Seconds) -> float:
        """The prefill tokens ``worker`` is estimated to still have queued at ``now``."""
        return self.speed.queue(worker, now)[0]

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """Queue the request's uncached tokens on ``worker``, then index its chain there."""
        rid, prompt = request.request_id, request.prompt_chars
        last, found, cuts = self._claims
        warm = self.speed.slot_cache(worker)  # else it gets a cold slot (``_slot_held``)
        if not warm:
            depth = young = resident = 0
        elif last == rid:  # the claims its placement weighed, the store's included
            depth = found.get(worker, 0)
            young, resident = cuts.get(worker, (depth, depth))
        else:
            depth = self.index.match_worker(request.prefix_hashes, worker)
            young, resident = self._cuts(request, worker, depth)
        young, resident, depth = (self._chars(d, request, worker) for d in (young, resident, depth))
        self._trust.note_routed(rid, worker, young, resident, depth)
        cached = self._trust.expected(young, resident, depth)
        seconds = (prompt - cached) * self._tokens_per_char / self._rate  # the lives' unit
        likely = self._trust.likely(young, resident, depth)  # the TTFT's, not its mean
        self._book(request, worker, now, likely, warm)  # a cold slot holds no reply
        lives = self._lives
        if request.session_key is not None:
            lives.sessions.add(now, self._recent_half_s, seconds, 0.0)
        elif request.prefix_hashes:
            opened = self._opened
            end = opened[1] if opened[0] == rid else lives.through(request)
            lives.turn(rid, now, seconds, None if end is None else end[3])
            lives.note(request, worker)
        super().on_routed(request, worker, now)
        if not warm:
            self.index.unclaimed(rid)  # a cold slot's miss says nothing of the worker's KV
        self._refill(worker, now)

    def session_life_s(self) -> float:
        """Prefill seconds an explicit session routes over its life, on average (0: none yet)."""
        return self._lives.sessions.mean()

    def chain_life_s(self) -> float:
        """Prefill seconds a headerless conversation routes over its life (0: none yet)."""
        return self._lives.chain_life()

    def opens(self, request: RequestFeatures) -> bool:
        """Whether a headerless request's chain runs through no earlier end (``Lives``)."""
        return self._lives.opens(request)

    def on_usage(
        self,
        request: RequestFeatures,
        worker: WorkerId,
        prompt_tokens: int,
        cached_tokens: int,
        now: Seconds,
        *,
        completion_tokens: int = 0,
    ) -> None:
        """The request is done (``CostLearning``): judge its claims, note its reply."""
        super().on_usage(
            request, worker, prompt_tokens, cached_tokens, now, completion_tokens=completion_tokens
        )
        rid, prompt = request.request_id, request.prompt_chars
        self._trust.note_usage(rid, worker, prompt, prompt_tokens, cached_tokens)
        self._lives.replied(request, int(completion_tokens / self._tokens_per_char))
        self._refill(worker, now)

    def on_worker_removed(self, worker: WorkerId) -> None:
        """Forget the worker's blocks, queue and counts (``CostLearning``), and its fill."""
        super().on_worker_removed(worker)
        self._fills.pop(worker, None)
        self.charged.pop(worker, None)

    # -- deciding -----------------------------------------------------------------

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """Stay (explicit sessions), or place by expected TTFT, or refuse; see the module docs."""
        cfg = self.config
        self.speed.late(ctx.fleet.now)  # a request late for its first token moves a fit
        self._age(ctx.fleet.now)
        found = None
        if request.session_key is None and request.prefix_hashes:
            self._opened = (request.request_id, self._lives.through(request))
            found = self.residency.matches(request, ctx)
        cands = candidates(request, ctx, self._holding(request), hard=True)
        bound, why = affinity_status(request, ctx, cfg.threshold_kind, cfg.threshold)
        running = "running" not in self._off  # the KV requests in flight share (ablation)
        if bound is not None:
            shared = self._shared_chars(request, bound.id) if running else 0
            return route(bound, "affinity_hit", shared_chars=shared)
        if not cands:
            return refuse(request, ctx, cfg.retry_after_s)

        old = ctx.affinity.worker if ctx.affinity is not None else None
        pool = cands
        if old is not None:
            kind, limit = cfg.threshold_kind, cfg.threshold
            pool = [w for w in cands if w.id != old and under_threshold(w, kind, limit)]
            if not pool:
                return Decision.refuse(CAPACITY_FULL, cfg.retry_after_s)

        worker, reason = self._place(request, pool, ctx, found)
        shared = self._shared_chars(request, worker.id) if running else 0
        self._remember_capacity(worker)
        if request.session_key is not None and ctx.affinity is None:
            self._lives.sessions.add(ctx.fleet.now, self._recent_half_s, 0.0, 1.0)
        if why != "new":
            reason = f"affinity_{why}_migrated"
        keyed = request.session_key is not None
        return route(worker, reason, request if keyed else None, old, shared)

    def _holding(self, request: RequestFeatures) -> Container[WorkerId]:
        """The pressured workers (soft or hard) that still take ``request``: all for a
        headerless request, none for a session's (``docs/dev/default.md``)."""
        if request.session_key is not None or not request.prefix_hashes or "holding" in self._off:
            return ()
        return _EVERY

    def hold_worth(self, request: RequestFeatures, worker: WorkerId, ctx: RouteContext) -> Seconds:
        """How much sooner ``request`` is expected to start on ``worker`` than on the best
        other open worker by ``_place``'s cost, the wait for KV room left out: 0 where
        ``_place`` would not choose it (``core.route``'s KV hold does not wait for it)."""
        kind, limit = self.config.threshold_kind, self.config.threshold
        cands = candidates(request, ctx, self._holding(request), hard=True)  # ``pick``'s
        pool = [w for w in cands if w.id == worker or under_threshold(w, kind, limit)]
        if len(pool) < 2:
            return 0.0
        if self._aside(request, pool, ctx, opening=False).id != worker:
            return 0.0
        costs = self._scored.by_id()
        mine = costs.pop(worker, math.inf)
        other = min(costs.values(), default=math.inf)
        # Chosen against its scored cost (the judged claims moved it): all the wait.
        return other - mine if other >= mine else math.inf

    def _aside(
        self, request: RequestFeatures, pool: list[WorkerState], ctx: RouteContext, *, opening: bool
    ) -> WorkerState:
        """``_place`` for a question about ``request`` (a warm-up's probe, a hold's worth),
        leaving what the last placement remembered for ``on_routed`` as it was."""
        saved = (self._opened, self._tail, self._claims)
        if opening:
            self._opened = (request.request_id, None)
        self._probing = True
        try:
            return self._place(request, pool, ctx)[0]
        finally:
            (self._opened, self._tail, self._claims), self._probing = saved, False

    def _place(
        self,
        request: RequestFeatures,
        pool: list[WorkerState],
        ctx: RouteContext,
        found: dict[WorkerId, int] | None = None,
    ) -> tuple[WorkerState, str]:
        """The worker of lowest cost (expected TTFT and what it evicts); see the module
        docs. ``found``: ``matches`` for this request, if ``pick`` has looked them up."""
        cfg, now = self.config, ctx.fleet.now
        own = matches = found if found is not None else self.residency.matches(request, ctx)
        claims, first, predict = own, pool[0], None
        if first.slots is not None or first.engine_prefill_s is not None:
            pool, own = self._slot_held(pool, own)  # engines of slots (llama.cpp)
            matches, predict, rate = own, self.speed.predict, self._rate
        restorable = int(request.restorable_blocks * cfg.restorable_credit)
        if restorable:
            # Cache by tier: KV on disk counts on every worker, a little less than in a slot.
            matches = {w.id: max(own.get(w.id, 0), restorable) for w in pool}
        per_char, prompt = self._tokens_per_char / self._rate, request.prompt_chars  # s a char
        fresh_all = prompt * per_char
        pace = self.speed.prior_of(None).prefill_s / self.speed.prior.prefill_s  # ``_paced``
        charged, idle, decode_s = self.charged.get, (0.0, IDLE_BOOK, 0.0, pace), self._decode_s
        evict = cfg.evict
        # An opening adds its conversation's whole life here, not this turn's; a
        # session's binding makes a pull buy nothing past this turn (module docs).
        stay, life, rid = cfg.stay * per_char, 0.0, request.request_id
        self._tail = (rid, WorkerId(""), 0, 0)
        if request.session_key is not None:
            stay, life = 0.0, self.session_life_s() if "session_life" not in self._off else 0.0
        elif request.prefix_hashes:
            opened = self._opened  # ``pick`` looked it up just before
            end = opened[1] if opened[0] == rid else self._lives.through(request)
            if end is None:
                life = self.chain_life_s() if "chain_life" not in self._off else 0.0
            elif (
                own.get(end[0], 0) >= end[1] and "tail" not in self._off
            ):  # the index still has its last block there
                self._tail = (rid, *end[:3])
        _, tail_worker, _, tail = self._tail
        tail = tail if tail < prompt else prompt
        depths = {0, *matches.values()}  # the depths held (a few), and none
        top = max(self._chars(deepest := max(depths), request, ""), tail)
        if life > 0.0 and cfg.warm_min_blocks and not restorable and not self._probing:
            self._openers.note(request, deepest)  # ``own`` is ``matches`` when not restorable
        # Terms by chain depth held (most hold one of a few): own prefill, evict weight,
        # pull; the tail's worker's under its depth's complement (its own, to its earlier
        # turn's end there).
        depth_of = matches
        if tail_worker:
            depth_of = {**matches, tail_worker: ~matches.get(tail_worker, 0)}
            depths.add(depth_of[tail_worker])
        terms: dict[int, tuple[float, float, float]] = {}
        for key in depths:
            chars = self.index.depth_chars(key if key >= 0 else ~key)
            cached = chars if chars < prompt else prompt
            if key < 0 and tail > cached:
                cached = tail
            fresh = fresh_all - cached * per_char
            terms[key] = (fresh, evict * (fresh if fresh >= life else life), stay * cached)
        depth_at = depth_of.get
        best, least, tied = pool[0], math.inf, False
        scores: list[float] = []  # per worker of ``pool``
        score = scores.append
        # One pass over plain locals, for every worker on every placement: its queue,
        # prefill, what it evicts and the pull at the prior's pace.
        for w in pool:
            fill, book, evicting, pulling = charged(wid := w.id, idle)  # ``Book.front``: its queue
            if w.kv_reserved_tokens:  # the books' fill alone is at most 1: only with these
                fill = min(1.0, fill + w.kv_reserved_tokens / (w.kv_capacity_tokens or math.inf))
                evicting, pulling = fill * pace, pace * (1.0 - fill)
            fresh, weight, pull = terms[depth_at(wid, 0)]
            drains, owes, _ = book.front if book.front[2] > now else book.settled(now)
            queued = drains - now
            queued = 0.0 if queued <= 0.0 else owes if queued > owes else queued
            if predict is not None and w.slots:  # at least the TTFT of the slots' model
                start = predict(wid, fresh * rate, now, in_flight=w.in_flight) - pace * fresh
                queued = start if start > queued else queued
            cost = w.in_flight * decode_s + queued + pace * fresh + weight * evicting
            if pull:
                cost -= pull * pulling  # a full cache keeps new work only by evicting
            score(cost)
            if cost <= least:  # the cheapest so far; exact ties (common at low load) after
                least, best, tied = cost, w, cost == least
        scored = Scored(pool, scores)
        if tied:
            best = scored.cheapest(lambda w: self._tie(w, now))
        self._scored = scored  # what ``hold_worth`` reads of the workers' costs
        if not restorable:
            best = self._vouched(request, best, scored, own, life=life, now=now)
            if claims is not own:  # where its chain ends reads every claim (``on_routed``)
                self._claims = (rid, claims, self._claims[2])
        if not top:
            return best, "least_loaded"
        if restorable and own.get(best.id, 0) < restorable:
            return best, "restorable_match"  # chosen for what it can restore, not hold
        held = self._chars(matches.get(best.id, 0), request, best.id)
        return best, "prefix_match" if held == top else "least_ttft"

    def _slot_held(
        self, pool: list[WorkerState], found: dict[WorkerId, int]
    ) -> tuple[list[WorkerState], dict[WorkerId, int]]:
        """Engines of slots (llama.cpp) with at most one more request in flight than the least
        (on a busy CPU their TTFTs outgrow the fit: 5 openings of 5 on one, p50 10 s against
        round robin's 1.5), ``found`` less claims where a cold slot is free (``slot_cache``),
        once what the engines report is read (``FleetSpeed.engines``)."""
        speed, least = self.speed, min(w.in_flight for w in pool)
        if speed.engines(pool):  # the pace moved: every fill charged at the new one
            for worker, (fill, book, _, _) in self.charged.items():
                self._paced(worker, fill, book)
        pool = [w for w in pool if not w.slots or w.in_flight <= least + 1]
        get, cached = found.get, speed.slot_cache
        cold = {w.id for w in pool if w.slots and get(w.id) and not cached(w.id)}
        return pool, ({w: d for w, d in found.items() if w not in cold} if cold else found)

    def _vouched(
        self,
        request: RequestFeatures,
        best: WorkerState,
        scored: Scored,
        found: dict[WorkerId, int],
        *,
        life: float,
        now: Seconds,
    ) -> WorkerState:
        """The cheapest worker once its cache claim is judged by what is likely resident.

        The costs counted every claim in full; judged (``ClaimShares``), a claim can
        only raise a cost: so only the cheapest worker's needs judging, then the next
        cheapest if it lost its place, and so on (usually one look-up a decision).
        """
        prompt, evict = request.prompt_chars, self.config.evict
        per_char = self._tokens_per_char / self._rate
        pace = self.speed.prior_of(None).prefill_s / self.speed.prior.prefill_s  # ``_place``'s
        judged: _Cuts = {}
        while True:
            depth = found.get(wid := best.id, 0)
            if not depth or wid in judged:
                break
            young, resident = judged[wid] = self._cuts(request, wid, depth)
            if young >= depth:
                break
            cached = self._chars(depth, request, wid)
            young, resident = (self._chars(d, request, wid) for d in (young, resident))
            unheld = cached - self._trust.expected(young, resident, cached)
            fill = self.charged.get(wid, (0.0,))[0]
            fresh = (prompt - cached) * per_char
            more = fresh + unheld * per_char  # its prefill there, and what that evicts
            evicts = evict * fill * (max(more, life) - max(fresh, life))
            extra = pace * (more - fresh + evicts)
            scored.add(best, extra)
            best = scored.cheapest(lambda w: self._tie(w, now))
        self._claims = (request.request_id, found, judged)
        return best

    def _cuts(self, request: RequestFeatures, worker: WorkerId, depth: int) -> tuple[int, int]:
        """Blocks of a claim younger than the KV turnover, and those judged resident."""
        if self.residency.told(request, worker) or "claims" in self._off:
            return depth, depth  # the engine's word (``told``): resident, as good as young
        return self.index.resident_cuts(request.prefix_hashes, worker, depth, LRU_TURNOVER)

    def _chars(self, depth: int, request: RequestFeatures, worker: WorkerId) -> int:
        """Characters of the request's prompt that ``depth`` blocks of it on ``worker``
        cover: to its earlier turn's end there (``_tail``) if they reach that."""
        if not depth:
            return 0
        chars = self.index.depth_chars(depth)
        rid, tail_worker, blocks, tail = self._tail
        if depth >= blocks and worker == tail_worker and rid == request.request_id:
            chars = tail if tail > chars else chars
        prompt = request.prompt_chars
        return chars if chars < prompt else prompt

    def _tie(self, worker: WorkerState, now: Seconds) -> tuple[int, float, float, str]:
        """Order among equal costs: load, recent requests, KV usage, id."""
        recent = self.speed.lately(worker.id, now)[0]
        return (worker.load, recent, worker.kv_usage or 0.0, worker.id)
