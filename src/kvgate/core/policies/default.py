"""``default``: sessions stick; new work goes where its first token comes soonest.

Used when the config names no policy. In order:

1. A request with the client's own session id (header or ``user``) whose binding
   (``ctx.affinity``) names a worker that is routable, not under hard pressure, under the sticky
   threshold and holding at most ``ceil(sticky_load_factor × mean load) + sticky_slack`` requests
   stays there: ``affinity_hit``. Past that cap (a request count) but under the threshold, the
   bound worker is placed against the others by the cost below (with its cache of the
   conversation), so the session leaves only where recomputing its context elsewhere is quicker
   than queueing at home. Nothing else binds: without a session id a request has no key, and is
   followed by its own prefix chain (a conversation's later turns extend it), never by a key
   derived from text strangers share.
2. Everything else is *placed* on the worker with the lowest cost, where a
   worker's cost is its expected time to first token for this request::

       ttft = (queued prefill tokens + this request's uncached tokens)
              / prefill_tokens_per_s + requests on it × decode_s
       cost = ttft + evict × uncached seconds × fill − pull

   ``fill`` is how full the worker's KV cache is with the chains recently sent there
   (``PrefixIndex.fill``: the index's weight for it over its KV capacity, capped at 1): new blocks
   on a full cache evict blocks that later requests would have hit, so fresh content goes where
   there is room, and a cold-start opening cannot pack every new conversation onto the two workers
   that computed it first while the others' caches stay empty.

   The ``pull`` of a cache is ``stay × cached tokens / prefill_tokens_per_s`` (the longest match of
   the whole prompt's chain, from this replica's index or the store's prefix state,
   ``ctx.holders``), decayed by ``1 / (1 + queued seconds / busy_half_s)`` and by the room left,
   ``1 - fill``. It keeps work on a warm worker a little past a tie (its cache will serve the next
   turns too), and fades as the warm worker's queue grows, so a cache-rich but busy worker cannot
   win forever, and as its cache fills: a full cache keeps new work only by evicting others'
   (without that fade agent-preamble put 142 of 240 requests on one worker while a cold one idled).
   That is herding prevention as its own mechanism: work leaves a warm worker when its expected
   TTFT is clearly worse than recomputing elsewhere, or when it has no room left, whatever the
   counts.

   On a backlogged fleet, recomputing a prefix another candidate holds also takes
   capacity from the requests queued behind it: a worker's cost carries ``waste ×
   (held − cached)`` prefill seconds (``core.policies.waste``). Without it one-shot
   questions behind a group's system prompt left the group's worker 1-5 times a run.

   A placement that *opens a conversation* decides where all of it goes, so what it will put in
   that cache is not this turn's uncached tokens but the conversation's whole life's: ``uncached
   seconds`` in the eviction term is then at least the conversation's expected life, in prefill
   seconds. Two kinds open one (counts halved every ``recent_half_life_s``):

   - a request with a session id placed by cost (a new session, or one migrating): every later
     turn follows its binding (``session_life_s``: prefill seconds routed with a session id over
     sessions placed). It has no ``pull``: its next turns hit wherever it goes, so a cache there
     buys only this turn's TTFT, which ``ttft`` already counts;
   - a headerless request that extends no earlier chain (``opens``): its later
     turns follow its own chain (``chain_life_s``: an opening's prefill, and a
     later turn's times the turns a conversation has, ``Conversations``, which
     reads young conversations long rather than short). One-shot traffic opens
     with every request, so its life is one request's. It keeps its pull: on
     one-shot traffic that is what keeps a group behind its prompt (without it
     shared-prefix-groups loses 3 points in the simulator).

   A headerless request *extends* a chain when its own chain runs through a *chain end*, where a
   headerless request routed earlier ended (``ChainEnds`` marks an end exactly: its last whole
   block and the hash of the text past it, so a later turn is found however much it adds, past
   the coarse blocks too). The end also says where that turn went: there the cache reaches to
   the end and the reply past it (``ChainEnds``' reach), not only to its last whole block
   (``_tail``; the index must still hold that block there). Past the 16 KiB of fine blocks a
   coarse block is 1,024 tokens, and an agent's second turn behind a 4,096-token preamble
   matched every worker holding the preamble alike: sent by load, it left its own task behind.
   Charging openings for their life keeps new conversations from all joining the worker that
   holds the shared text until its cache overflows with their growing contexts: light chat
   behind one system prompt (explicit sessions), agents behind one tool preamble (headerless).

   Load is counted in what it costs a request: queued prefill tokens, KV use, requests in
   flight. The queue is this policy's own estimate: each routed request adds its uncached tokens
   to its worker's queue, which drains at ``prefill_tokens_per_s`` and is never more than the
   uncached tokens of the requests still in flight there (so a wrong rate cannot make it drift;
   one that reports no usage leaves at its end). Workers at ``kv_high`` KV use are skipped
   unless all are or one holds this turn's history. A soft-pressured worker still takes a
   headerless request whose prompt it holds at least half of (``_holding``; ``candidates``):
   there the request adds only its own part's KV.

   The TTFT terms (queue estimate, own prefill) count a cache in full where it is younger than
   one KV turnover (``PrefixIndex.resident_depth``), and of the rest the share usage confirms
   (``ClaimShares``): one share for the band still judged resident (trusted at first), one past
   it (old entries, the store's holders); the pull weighs the whole claim. Stale claims hid
   10-30k-token recomputes. KV of sessions away on a tool call (``kv_reserved_tokens``)
   counts in ``fill`` as taken. Blocks the request says are restorable from disk
   (``restorable_blocks``: a llama.cpp slot saved where every worker reads) count as cached
   on every worker at ``restorable_credit``; a worker chosen for them is a ``restorable_match``.

   Every decision says how much of the prompt's KV its worker holds in use (``Decision.
   shared_chars``: leading blocks requests in flight there share, ``RunningBlocks``);
   the KV gate counts only the rest as the request's new KV.

   Reasons: ``prefix_match`` (the worker with the longest match), ``least_ttft`` (a
   colder worker: the warm one's queue outweighed its cache), ``least_loaded`` (nothing
   of the prompt cached anywhere). A session that had to leave its worker says why
   (``affinity_{overloaded,lost,pressure,version}_migrated``) and is bound where it
   goes (``AffinityWrite`` with ``expected`` the old worker); a new one where placed.

Bursts of siblings (sharing a long new prefix) land together: a routed chain is
in the index at once, and the queue estimate says when its worker is done with it.
Claims on caches come from ``Residency``: where a worker publishes KV events, its engine's word.

Example (every option is ``DefaultConfig``'s)::

    policy: default
    options:
      threshold: 0.8
      prefill_tokens_per_s: 12000
      decode_s: 0.002
      stay: 0.5
      evict: 1.0
      waste: 2.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container

from kvgate.core.decision import CAPACITY_FULL, Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import WorkerState
from kvgate.core.hashing import bounded_load_cap
from kvgate.core.policies.base import (
    Holding,
    affinity_status,
    candidates,
    cheapest,
    refuse,
    route,
    under_threshold,
)
from kvgate.core.policies.books import Life as _Life
from kvgate.core.policies.books import Queues
from kvgate.core.policies.chain_ends import ChainEnds, Through
from kvgate.core.policies.claims import LRU_TURNOVER, ClaimShares
from kvgate.core.policies.conversations import Conversations
from kvgate.core.policies.default_config import DefaultConfig
from kvgate.core.policies.learning import SpeedLearning
from kvgate.core.policies.openers import Openers
from kvgate.core.policies.warming import Warming
from kvgate.core.policies.waste import Waste, rescore
from kvgate.core.policy import RouteContext
from kvgate.core.speed import FleetSpeed, Speed
from kvgate.types import Seconds, WorkerId

__all__ = ["DefaultConfig", "DefaultPolicy"]

_Cuts = dict[WorkerId, tuple[int, int]]  # per worker: blocks (young, resident) of a claim


class DefaultPolicy(Warming, SpeedLearning):
    """Sticky explicit sessions; everything else placed by expected time to first token."""

    name = "default"

    def __init__(self, config: DefaultConfig | None = None) -> None:
        self.config = config if config is not None else DefaultConfig()
        super().__init__(self.config.index)
        cfg = self.config
        self._tokens_per_char = 1.0 / cfg.index.chars_per_token
        # The model's rates and times, in the driver's clock (an engine's own TTFT too).
        scale = self.engine_seconds = cfg.time_scale
        self._rate = cfg.prefill_tokens_per_s * scale
        self._decode_s = cfg.decode_s / scale
        self._half_s = cfg.busy_half_s / scale
        self._recent_half_s = cfg.recent_half_life_s / scale
        horizon = cfg.outstanding_horizon_s / scale
        self._queues = Queues(self._rate, self._recent_half_s, horizon, cfg.index.max_pending)
        self._costs = self._queues.costs  # what a decision reads of each worker's queue
        self.speed = FleetSpeed(Speed(0.0, 1.0 / self._rate, self._decode_s))  # ``learning``
        # What a conversation brings over its life: explicit sessions (prefill seconds routed
        # with a session id over sessions placed for the first time), and headerless ones
        # (``Conversations``: an opening's prefill, and a later turn's times its turns).
        self._sessions = _Life()
        self._chains = Conversations(self._recent_half_s, cfg.chain_ends)
        self._waste = Waste(cfg.waste, self._half_s)  # what prefill done twice costs
        # Where each recent headerless request ended (``ChainEnds``).
        self._ends = ChainEnds(cfg.chain_ends, self.index.depth_chars)
        # The last request placed and whether it opened a conversation (``on_routed``).
        self._opened: tuple[str, Through | None] = ("", None)
        # Shares of a claim's old part that hit (module docs): still judged resident
        # (trusted at first), and past that. The last placement's claims: request id,
        # per worker the blocks claimed and the (young, resident) cuts (``_cuts``).
        self._trust = ClaimShares(max_pending=cfg.index.max_pending)
        self._claims: tuple[str, dict[WorkerId, int], _Cuts] = ("", {}, {})
        # The last placement's chain end (``ChainEnds.through``): request id, the worker
        # its earlier turn went to, the blocks to that turn's last whole one, its reach.
        self._tail: tuple[str, WorkerId, int, int] = ("", WorkerId(""), 0, 0)
        # Warm-ups (``warm_up``): the shared prefixes recent openings matched, and
        # whether ``_place`` runs for one of them (placed again) rather than a request.
        self._openers = Openers(cfg.warm_min_blocks)
        self._probing = False
        # The last placement's costs, per worker scored (``_place``; ``hold_worth``).
        self._scored: list[tuple[float, WorkerState]] = []

    # -- learning -----------------------------------------------------------------

    def queued_tokens(self, worker: WorkerId, now: Seconds) -> float:
        """The prefill tokens ``worker`` is estimated to still have queued at ``now``."""
        return self._queues.queued_tokens(worker, now)

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """Queue the request's uncached tokens on ``worker``, then index its chain there."""
        rid, prompt = request.request_id, request.prompt_chars
        last, found, cuts = self._claims
        if last == rid:  # the claims its placement weighed, the store's included
            depth = found.get(worker, 0)
            young, resident = cuts.get(worker, (depth, depth))
        else:
            depth = self.index.match_worker(request.prefix_hashes, worker)
            young, resident = self._cuts(request, worker, depth)
        young, resident, depth = (self._chars(d, request, worker) for d in (young, resident, depth))
        self._trust.note_routed(rid, worker, young, resident, depth)
        cached = self._trust.expected(young, resident, depth)
        seconds = (prompt - cached) * self._tokens_per_char / self._rate
        hashes = tuple(request.prefix_hashes)
        self._queues.routed(rid, worker, seconds, hashes, now)
        likely = prompt - self._trust.likely(young, resident, depth)  # the TTFT's, not its mean
        self.speed.sent(rid, worker, now, likely * self._tokens_per_char)
        self._waste.pace.note(now)
        if request.session_key is not None:
            self._sessions.add(now, self._recent_half_s, seconds, 0.0)
            self._waste.turns.add(now, self._recent_half_s, 1.0, 0.0)
        elif hashes:
            opened = self._opened
            end = opened[1] if opened[0] == rid else self._ends.through(request)
            opens = end is None
            self._chains.routed(rid, now, seconds, None if end is None else end[3])
            self._waste.turns.add(now, self._recent_half_s, 1.0, 1.0 if opens else 0.0)
            held = found if last == rid else self.index.match(hashes)  # own text starts past
            self._ends.note(request, worker, max(held.values(), default=0), end)
        super().on_routed(request, worker, now)
        self._queues.refill(worker, self.index.fill(worker))

    def session_life_s(self) -> float:
        """Prefill seconds an explicit session routes over its life, on average (0: none yet)."""
        return self._sessions.mean()

    def chain_life_s(self) -> float:
        """Prefill seconds a headerless conversation routes over its life (0: none yet)."""
        return self._chains.life_s()

    def opens(self, request: RequestFeatures) -> bool:
        """Whether a headerless request's chain runs through no earlier end (``ChainEnds``)."""
        return self._ends.opens(request)

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
        """The request is done: its tokens leave the queue bound; correct the index."""
        self._queues.reported(request.request_id)
        self.speed.ended(request.request_id, prompt_tokens, cached_tokens)
        super().on_usage(request, worker, prompt_tokens, cached_tokens, now)
        rid, prompt = request.request_id, request.prompt_chars
        self._trust.note_usage(rid, worker, prompt, prompt_tokens, cached_tokens)
        self._ends.replied(request, int(completion_tokens / self._tokens_per_char))
        self._queues.refill(worker, self.index.fill(worker))

    def on_dropped(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """No usage will come: the request's prefill leaves the worker's queue bound."""
        self._queues.reported(request.request_id)
        self.speed.dropped(request.request_id)

    def on_worker_removed(self, worker: WorkerId) -> None:
        """Forget the worker's blocks, queue and counts."""
        super().on_worker_removed(worker)
        self._queues.forget(worker)

    # -- deciding -----------------------------------------------------------------

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """Stay (explicit sessions), or place by expected TTFT, or refuse; see the module docs."""
        cfg = self.config
        home, found = None, None
        if request.session_key is None and request.prefix_hashes:
            # A later turn's home (``candidates``): where its earlier turn went.
            end = self._ends.through(request)
            self._opened = (request.request_id, end)
            home = end[0] if end is not None else None
            found = self.matches(request, ctx)
        cands = candidates(request, ctx, home, self._holding(request, ctx, found))
        sticky_cap = None
        if ctx.affinity is not None and cands and cfg.sticky_load_factor is not None:
            total = sum([w.in_flight + (w.waiting or 0) for w in cands])  # ``load``, inlined
            sticky_cap = bounded_load_cap(
                total, len(cands), cfg.sticky_load_factor, cfg.sticky_slack
            )
        bound, why = affinity_status(request, ctx, cfg.threshold_kind, cfg.threshold, sticky_cap)
        if bound is not None:
            return route(bound, "affinity_hit", shared_chars=self._shared_chars(request, bound.id))
        if not cands:
            return refuse(request, ctx, cfg.retry_after_s)

        old = ctx.affinity.worker if ctx.affinity is not None else None
        pool = cands
        kept: WorkerState | None = None
        if old is not None:
            pool = [
                w
                for w in cands
                if w.id != old and under_threshold(w, cfg.threshold_kind, cfg.threshold)
            ]
            if why == "overloaded" and sticky_cap is not None:
                # Over the sticky cap only (by request count): the session leaves only
                # if recomputing its context elsewhere is quicker than queueing here.
                kept, _ = affinity_status(request, ctx, cfg.threshold_kind, cfg.threshold)
                if kept is not None:
                    pool.append(kept)
            if not pool:
                return Decision.refuse(CAPACITY_FULL, cfg.retry_after_s)

        worker, reason = self._place(request, pool, ctx, found)
        shared = self._shared_chars(request, worker.id)
        if kept is not None and worker.id == kept.id:
            return route(worker, "affinity_hit", shared_chars=shared)
        self._remember_capacity(worker)
        if request.session_key is not None and ctx.affinity is None:
            self._sessions.add(ctx.fleet.now, self._recent_half_s, 0.0, 1.0)
            self._waste.turns.add(ctx.fleet.now, self._recent_half_s, 0.0, 1.0)
        if why != "new":
            reason = f"affinity_{why}_migrated"
        keyed = request.session_key is not None
        return route(worker, reason, request if keyed else None, old, shared)

    def _holding(
        self, request: RequestFeatures, ctx: RouteContext, found: dict[WorkerId, int] | None
    ) -> Container[WorkerId]:
        """For a headerless request, the workers whose cache claims cover at least half of
        its prompt (``found``: ``matches``, looked up if ``None``): a soft-pressured one
        still takes it (``candidates``). None for a session's request: soft pressure takes
        no new sessions."""
        if request.session_key is not None or not request.prefix_hashes:
            return ()
        found = found if found is not None else self.matches(request, ctx)
        return Holding(found, self.index.depth_for_chars(-(-request.prompt_chars // 2)))

    def _shared_chars(self, request: RequestFeatures, worker: WorkerId) -> int:
        """Leading characters of the prompt whose KV requests in flight on ``worker`` hold."""
        hashes = request.prefix_hashes
        depth = self._queues.running.shared_depth(worker, hashes) if hashes else 0
        if not depth:
            return 0
        chars = self.index.depth_chars(depth)
        return chars if chars < request.prompt_chars else request.prompt_chars

    def hold_worth(self, request: RequestFeatures, worker: WorkerId, ctx: RouteContext) -> Seconds:
        """How much sooner ``request`` is expected to start on ``worker`` than on the best
        other open worker by this policy's cost (``_place``: queue, prefill with its claims
        judged, the cache a move would evict), the wait for KV room left out. The KV hold
        does not wait for a worker worth nothing (``core.route``): a home that evicted a
        session's history, or one ``_place`` would skip (KV at ``kv_high``)."""
        cfg, opened = self.config, self._opened  # ``pick`` looked the chain's end up
        home = opened[1][0] if opened[0] == request.request_id and opened[1] else None
        kind, limit = cfg.threshold_kind, cfg.threshold
        holding = self._holding(request, ctx, None)
        cands = candidates(request, ctx, home, holding)  # those ``pick`` may place it on
        pool = [w for w in cands if w.id == worker or under_threshold(w, kind, limit)]
        if len(pool) < 2:
            return 0.0
        if self._aside(request, pool, ctx, opening=False).id != worker:
            return 0.0
        costs = {w.id: cost for cost, w in self._scored}
        mine = costs.pop(worker, math.inf)
        other = min(costs.values(), default=math.inf)
        # Chosen against its scored cost (the waste or claims terms moved it): all the wait.
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
        """The worker of lowest cost (expected TTFT minus its cache's pull); see the module
        docs. ``found``: ``matches`` for this request, if ``pick`` has looked them up."""
        cfg, now = self.config, ctx.fleet.now
        own = matches = found if found is not None else self.matches(request, ctx)
        restorable = int(request.restorable_blocks * cfg.restorable_credit)
        if restorable:
            # Cache by tier: KV on disk counts on every worker, a little less than in a slot.
            matches = {w.id: max(own.get(w.id, 0), restorable) for w in pool}
        per_char = self._tokens_per_char / self._rate  # prefill seconds per character
        prompt = request.prompt_chars
        fresh_all = prompt * per_char
        icfg = self.index.config
        fine, coarse, block_chars = icfg.fine_blocks, icfg.coarse_factor, icfg.block_chars
        costs = self._costs.get
        kv_high, decode_s = cfg.kv_high, self._decode_s
        evict, stay, half = cfg.evict, cfg.stay * per_char, self._half_s
        # An opening adds its conversation's whole life here, not this turn's; a new
        # session's binding makes a pull buy nothing past this turn (module docs).
        life, rid = 0.0, request.request_id
        self._tail = (rid, WorkerId(""), 0, 0)
        if request.session_key is not None:
            life, stay = self.session_life_s(), 0.0
        elif request.prefix_hashes:
            opened = self._opened  # ``pick`` looked it up just before
            end = opened[1] if opened[0] == rid else self._ends.through(request)
            if end is None:
                life = self.chain_life_s()
            elif own.get(end[0], 0) >= end[1]:  # the index still has its last block there
                self._tail = (rid, *end[:3])
        _, tail_worker, _, tail = self._tail
        tail = tail if tail < prompt else prompt
        get = matches.get
        held: Callable[[WorkerId], int] = lambda w: self._chars(get(w, 0), request, w)  # noqa: E731
        evict_all = evict * (fresh_all if fresh_all >= life else life)
        top = max(self._chars(deepest := max(matches.values(), default=0), request, ""), tail)
        if life > 0.0 and cfg.warm_min_blocks and not restorable and not self._probing:
            self._openers.note(request, deepest)  # ``own`` is ``matches`` when not restorable
        backlog = math.inf  # the shortest queue among the workers scored (the waste term)
        best: WorkerState | None = None
        best_cost = math.inf
        best_tie: tuple[int, float, float, str] | None = None
        scored: list[tuple[float, WorkerState]] = []
        # Terms by chain depth held (most hold one of a few): own prefill, evict weight, pull.
        terms: dict[int, tuple[float, float, float]] = {0: (fresh_all, evict_all, 0.0)}
        # One pass over plain locals (this runs for every worker on every placement);
        # a second one admits workers at kv_high only when all are (a later turn's home first).
        for admit_high in (False, True):
            scored.clear()
            for w in pool:
                kv = w.kv_usage or 0.0
                if kv >= kv_high and not admit_high and w.id != tail_worker:
                    continue
                wid = w.id
                entry = costs(wid)
                if entry is None:
                    queued = fill = 0.0
                else:
                    until, owed, fill = entry
                    queued = until - now
                    if queued <= 0.0:
                        queued = 0.0
                    elif queued > owed:
                        queued = owed
                fill = min(1.0, fill + w.kv_reserved_tokens / (w.kv_capacity_tokens or math.inf))
                backlog = queued if queued < backlog else backlog
                depth = get(wid, 0)
                key = depth if wid != tail_worker else ~depth  # the tail's worker: its own
                term = terms.get(key)
                if term is None:
                    # ``PrefixIndex.depth_chars``, inlined; to its earlier turn's end there.
                    chars = depth if depth <= fine else fine + (depth - fine) * coarse
                    cached = chars * block_chars if chars * block_chars < prompt else prompt
                    if wid == tail_worker and tail > cached:
                        cached = tail
                    fresh = fresh_all - cached * per_char
                    weight = evict * (fresh if fresh >= life else life)
                    terms[key] = term = (fresh, weight, stay * cached)
                fresh, weight, pull = term
                cost = (w.in_flight + (w.waiting or 0)) * decode_s
                cost += queued + fresh + weight * fill
                if pull:
                    cost -= pull * (1.0 - fill) / (1.0 + queued / half)
                scored.append((cost, w))
                if cost < best_cost:
                    best, best_cost, best_tie = w, cost, None
                elif cost == best_cost and best is not None:
                    # Exact ties are common at low load: only then order them.
                    if best_tie is None:
                        best_tie = self._tie(best, now)
                    tie = self._tie(w, now)
                    if tie < best_tie:
                        best, best_tie = w, tie
            if best is not None:
                break
        assert best is not None  # ``pool`` is non-empty
        self._scored = scored  # what ``hold_worth`` reads of the workers' costs
        if top and cfg.waste and backlog > 0.0 and held(best.id) < top:
            best = self._wasted(request, best, scored, matches, held, backlog=backlog, now=now)
        if not restorable:
            best = self._vouched(request, best, scored, own, life=life, now=now)
        if not top:
            return best, "least_loaded"
        if restorable and own.get(best.id, 0) < restorable:
            return best, "restorable_match"  # chosen for what it can restore, not hold
        return best, "prefix_match" if held(best.id) == top else "least_ttft"

    def _wasted(
        self,
        request: RequestFeatures,
        best: WorkerState,
        scored: list[tuple[float, WorkerState]],
        found: dict[WorkerId, int],
        held: Callable[[WorkerId], int],
        *,
        backlog: Seconds,
        now: Seconds,
    ) -> WorkerState:
        """The cheapest once the waste term charges those holding less than the best holder
        (called when the cheapest holds less than the longest match: ``found`` blocks,
        ``held`` characters of the prompt on a worker)."""
        ids = {w.id for _, w in scored}
        _, holder = max(((d, w) for w, d in found.items() if w in ids), default=(0, ""))
        tail_worker = self._tail[1]
        if tail_worker in ids and held(tail_worker) > held(holder):
            holder = tail_worker  # deeper by its earlier turn's end there
        most = held(holder)
        waste = self._waste
        factor = waste.factor(now, backlog, len(scored)) * waste.fade(now, self._costs.get(holder))
        cuts = self._cuts(request, holder, found.get(holder, 0))
        young, resident = (self._chars(d, request, holder) for d in cuts)
        likely = self._trust.expected(young, resident, most)
        if factor <= 0.0 or likely <= 0.0 or held(best.id) >= most:
            return best
        cached = lambda w: held(w.id)  # noqa: E731
        return rescore(scored, cached, likely, factor * self._tokens_per_char / self._rate,
                       lambda w: self._tie(w, now))  # fmt: skip

    def _vouched(
        self,
        request: RequestFeatures,
        best: WorkerState,
        scored: list[tuple[float, WorkerState]],
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
        judged: _Cuts = {}
        while True:
            wid = best.id
            depth = found.get(wid, 0)
            if not depth or wid in judged:
                break
            young, resident = judged[wid] = self._cuts(request, wid, depth)
            if young >= depth:
                break
            cached = self._chars(depth, request, wid)
            young, resident = (self._chars(d, request, wid) for d in (young, resident))
            unheld = cached - self._trust.expected(young, resident, cached)
            fill = self._costs.get(wid, (0.0, 0.0, 0.0))[2]
            fresh = (prompt - cached) * per_char
            more = fresh + unheld * per_char  # its prefill there, and what that evicts
            extra = more - fresh + evict * fill * (max(more, life) - max(fresh, life))
            at = next(i for i, (_, w) in enumerate(scored) if w is best)
            scored[at] = (scored[at][0] + extra, best)
            best = cheapest(scored, lambda w: self._tie(w, now))
        self._claims = (request.request_id, found, judged)
        return best

    def _cuts(self, request: RequestFeatures, worker: WorkerId, depth: int) -> tuple[int, int]:
        """Blocks of a claim younger than the KV turnover, and those judged resident."""
        if self.told(request, worker):
            return depth, depth  # the engine's word (``Residency``): resident, as good as young
        hashes, index = request.prefix_hashes, self.index
        resident = index.resident_depth(hashes, worker, depth)
        if resident <= 0:
            return 0, 0
        return index.resident_depth(hashes, worker, resident, LRU_TURNOVER), resident

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
        recent = self._queues.recent(worker.id, now)
        return (worker.load, recent, worker.kv_usage or 0.0, worker.id)
