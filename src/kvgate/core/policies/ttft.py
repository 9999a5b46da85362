"""``ttft``: each request goes where it is predicted to cost the fleet least time.

The one-objective successor of ``default`` (issue 46), judged beside it (``benchmarks/
judge.py --own ttft``). For a request and each candidate worker ``w`` (``candidates``:
routable, not full, of the pinned version, no new conversation where memory is
pressured; those under ``kv_high`` KV use while any is), it predicts, in seconds::

    cost(w) = ttft(w) + prefill_w × (delayed(w) + evicted(w))
    ttft(w) = overhead_w + prefill_w × (queued_w + uncached_w) + decode × running_w

- ``ttft(w)``: this request's own wait. ``uncached_w``: the prompt's tokens ``w`` does not
  hold (``Residency``: the index of what was sent where, corrected by usage, or the
  engine's KV events; blocks restorable from disk count on every worker at
  ``restorable_credit``); an index claim older than a KV turnover there is likely
  evicted, so it counts only up to where it is likely resident (``Residency.resident``,
  judged for the cheapest worker, then the next if it lost its place: a cut only raises a
  cost). ``queued_w``, ``running_w``: this replica's exact book of ``w`` (``core.speed``;
  with ``engine_queue``, raised by what the engine reports waiting). ``overhead_w``,
  ``prefill_w``: learned from every observed TTFT (``FleetSpeed``: least squares with
  forgetting, the fleet's estimate for a new worker; before any, the engines' own prefill
  rate where they report it); ``decode`` stays at its prior. An engine of a few batch
  slots (llama.cpp) is no queue: ``queued_w`` is what the request shares its slots' batch
  with, and past the slots it first waits for one to free (``core.speed``); its free
  slots that never served are cold (``FleetSpeed.slot_cache``).
- ``delayed(w)``: what the request's prefill takes from later ones: ``uncached_w`` times
  the requests expected to queue behind it (``w``'s share of the arrival rate times the
  fleet's shortest queue plus this prefill, at most ``delay_cap``). On a backlogged fleet
  a recompute of what another worker holds is capacity every later request waits for.
- ``evicted(w)``: the tokens later requests would have hit that the request's new KV
  pushes out of ``w`` (``caches.evicted_tokens``): the new tokens times how many times
  over ``w``'s cache is filled by what was recently sent there, times the fleet's
  measured hit ratio (KV reserved for sessions away on a tool call: certain to be hit).
  A request that opens a conversation, or a session placed away from its home, brings
  its conversation's whole life there (``lives``), not only this turn's tokens.

The request goes to the worker of least cost (ties: the session's home, fewest requests,
id). A session is bound where it goes; its next request is scored the same way, its home
holding its history, so it leaves only where leaving costs less.

Reasons: ``affinity_hit`` (a session stays), ``affinity_{overloaded,lost,pressure,version}
_migrated`` (it left: its home cost more, or was gone, pressured, of another version),
``prefix_match`` (the deepest holder), ``least_ttft`` (a colder worker cost less),
``restorable_match`` (chosen for KV it restores from disk), ``least_loaded`` (nothing
cached anywhere).

Example (every option is ``TtftConfig``'s)::

    policy: ttft
    options:
      prefill_tokens_per_s: 12000   # priors, in model seconds
      decode_s: 0.005
      delay_cap: 2.0
      evict: 1.0
"""

from __future__ import annotations

from collections.abc import Container

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import WorkerState
from kvgate.core.policies.base import Holding, affinity_status, candidates, refuse, route
from kvgate.core.policies.caches import evicted_tokens
from kvgate.core.policies.learning import CostLearning
from kvgate.core.policies.lives import Lives
from kvgate.core.policies.pace import Pace
from kvgate.core.policies.ttft_config import TtftConfig
from kvgate.core.policy import RouteContext
from kvgate.core.speed import FleetSpeed, Look, Observation, Speed
from kvgate.types import Seconds, WorkerId

__all__ = ["TtftConfig", "TtftPolicy"]

_REUSE_GAIN = 0.0125  # weight of each request in the fleet's hit-ratio average
_RELOOK = 16  # fits between two looks at every worker (``on_observed``)


class TtftPolicy(CostLearning):
    """Places each request on the worker of least predicted TTFT plus eviction cost."""

    name = "ttft"

    def __init__(self, config: TtftConfig | None = None) -> None:
        self.config = cfg = config if config is not None else TtftConfig()
        super().__init__(cfg.index)  # the index, the chains in flight, the replies
        scale = cfg.time_scale  # the priors are the model's; the fit is in the driver's clock
        prior = Speed(cfg.overhead_s / scale, 1.0 / (cfg.prefill_tokens_per_s * scale),
                      cfg.decode_s / scale)  # fmt: skip
        # Overhead and prefill are fitted; decode and queueing stay at their priors: in the
        # gateway's observations the running count barely moves on a worker, so the fit
        # traded them against overhead (a worker's decode coefficient came out anywhere
        # from 0.02 to 9 ms on one shape), and a worker predicted slow was sent nothing
        # more to correct it.
        self.speed = FleetSpeed(prior, forgetting=cfg.forgetting, max_pending=cfg.index.max_pending,
                                fitted=(True, True, False, False))  # fmt: skip
        self.learn = cfg.learn
        self.engine_seconds = scale
        self._reuse: float | None = None  # the fleet's measured hit ratio
        self._pace = Pace()  # requests a second, for the delay a placement adds to later ones
        self._fill: dict[WorkerId, float] = {}  # ``PrefixIndex.fill``, as of its last change
        # Each worker's speed and book (``FleetSpeed.look``), as of their last change: all
        # are taken again every ``_RELOOK`` fits (the fleet's median, a fit's age move).
        self._looks: dict[WorkerId, Look] = {}
        self._fleet_seen: Speed | None = None  # the fleet's speed the looks were taken with
        self._fits = 0
        # What a conversation brings, and a later turn's earlier end (``lives``: as
        # ``default`` reads them, agent-preamble lost 1.9 points of hit, p99 1.6x).
        self._lives = Lives(self.index.depth_chars, lone=False, shared=False, reach=False)
        # The last placement: request id, characters held per worker, whether it opens a
        # conversation; and the scores.
        self._last: tuple[str, dict[WorkerId, int], bool] = ("", {}, False)
        self._scored: list[tuple[float, WorkerState]] = []

    # -- learning -------------------------------------------------------------------

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """Book the request's uncached tokens on ``worker``, then index its chain there."""
        rid, prompt = request.request_id, request.prompt_chars
        last, held, opens = self._last
        if last == rid:
            cached = held.get(worker, 0)
        else:
            cached = self.index.depth_chars(self.index.match_worker(request.prefix_hashes, worker))
            opens = self._lives.opens(request, False)
        uncached = max(prompt - cached, 0) * self._tokens_per_char
        self._book(request, worker, now, cached, True)  # and a session's last reply
        self._looks.pop(worker, None)
        self._pace.note(now)
        self._lives.routed(uncached, opens)
        self._lives.note(request, worker)
        super().on_routed(request, worker, now)
        self._fill[worker] = self.index.fill(worker, self.index.config.kv_overcommit)

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
        """Correct the index, close the request's book entry (``CostLearning``), fold its
        hit ratio into the fleet's."""
        super().on_usage(
            request, worker, prompt_tokens, cached_tokens, now, completion_tokens=completion_tokens
        )
        self._fill[worker] = self.index.fill(worker, self.index.config.kv_overcommit)
        self._looks.pop(worker, None)
        if prompt_tokens > 0:
            # The fleet's, not the worker's: a worker thrashing its cache measured a low
            # ratio, which made evicting there look cheap and drew more new sessions to it.
            ratio = min(cached_tokens / prompt_tokens, 1.0)
            old = self._reuse
            self._reuse = ratio if old is None else old + _REUSE_GAIN * (ratio - old)

    def on_dropped(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """Nothing will be observed: the request leaves the book (``CostLearning``)."""
        super().on_dropped(request, worker, now)
        self._looks.pop(worker, None)

    def on_first_token(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """Its prefill is done: it leaves the worker's queue (``SpeedLearning``)."""
        super().on_first_token(request, worker, now)
        self._looks.pop(worker, None)

    def on_observed(
        self, request: RequestFeatures, worker: WorkerId, observed: Observation, now: Seconds
    ) -> None:
        """Fit the worker's speed (``SpeedLearning``); every ``_RELOOK`` fits, look again
        at every worker (the fleet's median speed, a cold worker's, moves with them)."""
        super().on_observed(request, worker, observed, now)
        self._looks.pop(worker, None)
        self._fits += 1
        if self._fits % _RELOOK == 0:
            self._looks.clear()

    def on_worker_removed(self, worker: WorkerId) -> None:
        """Forget the worker's blocks, book and speed."""
        super().on_worker_removed(worker)
        self._fill.pop(worker, None)
        self._looks.clear()

    # -- deciding -------------------------------------------------------------------

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """The candidate of least predicted TTFT plus eviction cost (module docs)."""
        cfg = self.config
        if self.speed.late(ctx.fleet.now):  # a request late for its first token: slower
            self._looks.clear()
        held = self.residency.held(request, ctx)
        restorable = self._restorable(request)
        if request.session_key is None:
            # A later turn's earlier prompt is cached where it went, to its end's mark.
            end = self._lives.through(request)
            opens = end is None
            if end is not None and end[2] > held.get(end[0], 0):
                held[end[0]] = min(end[2], request.prompt_chars)
        else:
            opens = ctx.affinity is None
        self._last = (request.request_id, held, opens)
        pool = self._candidates(request, ctx, held)
        home, why = affinity_status(request, ctx, "fraction", 1.0)
        if not pool:
            return refuse(request, ctx, cfg.retry_after_s)
        if home is not None and all(w is not home for w in pool):
            home = None  # (``is``: workers are compared field by field otherwise)
        best = self._place(request, pool, ctx, held, restorable, opens=opens)
        shared = self._shared_chars(request, best.id)
        if home is not None and best.id == home.id:
            return route(home, "affinity_hit", shared_chars=shared)
        self._remember_capacity(best)
        old = ctx.affinity.worker if ctx.affinity is not None else None
        if old is not None:
            reason = f"affinity_{'overloaded' if why == 'hit' else why}_migrated"
        else:
            top = max(max(held.values(), default=0), restorable)
            mine = held.get(best.id, 0)
            if not top:
                reason = "least_loaded"
            elif mine < restorable:
                reason = "restorable_match"
            else:
                reason = "prefix_match" if mine >= top else "least_ttft"
        keyed = request.session_key is not None
        return route(best, reason, request if keyed else None, old, shared)

    @staticmethod
    def _candidates(
        request: RequestFeatures, ctx: RouteContext, held: dict[WorkerId, int]
    ) -> list[WorkerState]:
        """Where ``request`` may go (``candidates``); a headerless one may also go to a
        worker under soft pressure that holds at least half its prompt (``held``: chars)."""
        holding: Container[WorkerId] = ()
        if request.session_key is None and held:
            holding = Holding(held, -(-request.prompt_chars // 2))
        return candidates(request, ctx, holding)

    def _restorable(self, request: RequestFeatures) -> int:
        """Characters of the prompt restorable from disk, at their credit (module docs)."""
        chars = self.index.depth_chars(request.restorable_blocks) * self.config.restorable_credit
        return min(int(chars), request.prompt_chars)

    def _place(
        self,
        request: RequestFeatures,
        pool: list[WorkerState],
        ctx: RouteContext,
        held: dict[WorkerId, int],
        restorable: int,
        *,
        opens: bool,
    ) -> WorkerState:
        """The worker of least cost in ``pool`` (non-empty); the scores kept for
        ``hold_worth``. An opening (``opens``), or a session placed away from its home,
        evicts its conversation's life."""
        cfg, now, speed = self.config, ctx.fleet.now, self.speed
        per_char, prompt = self._tokens_per_char, request.prompt_chars
        evict, engine, fill_of = cfg.evict, cfg.engine_queue, self._fill.get
        reuse, cap = self._reuse or 0.0, cfg.delay_cap
        home = ctx.affinity.worker if ctx.affinity is not None else None
        away = self._lives.tokens() if opens or home is not None else 0.0
        open_ = [w for w in pool if (w.kv_usage or 0.0) < cfg.kv_high] or pool
        first = open_[0]
        reports = first.slots is not None or first.engine_prefill_s is not None
        if reports:
            speed.engines(open_)  # what each engine reports of itself (llama.cpp's slots, speed)
            self._looks.clear()  # the fleet's speed may have moved with them
        fleet = speed.fleet()  # a worker not yet warm is predicted with it: when it moves,
        if fleet is not self._fleet_seen:  # every look taken with the old one is stale
            self._looks.clear()
            self._fleet_seen = fleet
        # Each candidate's speed and book (``Look``), kept from one change to the next,
        # the prefill queued there now, and the shortest such queue in seconds.
        seen: list[tuple[Speed, float, int, int]] = []
        stored, take = self._looks, speed.look
        backlog = float("inf")
        for w in open_:
            look = stored.get(w.id)
            if look is None or now >= look.until:
                look = stored[w.id] = take(w.id, now)
            sp, tokens, left, as_of, unstarted, decoding, _ = look
            queued = 0.0
            if unstarted:  # ``Look.queued``, inlined: this runs for every candidate
                prefill_s = sp.prefill_s
                left = left - (now - as_of) / prefill_s if prefill_s > 0.0 else 0.0
                queued = (tokens if tokens < left else left) if left > 0.0 else 0.0
                queued_s = queued * prefill_s
                backlog = queued_s if queued_s < backlog else backlog
            else:
                backlog = 0.0
            seen.append((sp, queued, unstarted, decoding))
        # Later requests a second per candidate: while every candidate has a queue, what
        # this request adds to one delays those behind it (at most ``delay_cap``).
        rate = self._pace.rate(now) / len(open_) if cap > 0.0 else 0.0
        held_get = held.get

        def costs(
            workers: list[WorkerState], seen: list[tuple[Speed, float, int, int]]
        ) -> list[tuple[float, WorkerState]]:
            out = []  # one loop, no call a worker but the eviction's
            for w, (sp, queued, unstarted, decoding) in zip(workers, seen, strict=True):
                wid, prefill_s = w.id, sp.prefill_s
                cached = held_get(wid, 0)
                if cached and w.slots is not None and not speed.slot_cache(wid):
                    # Its free slots are cold: what its other slots hold is theirs (and the
                    # request is booked there as uncached: ``on_routed`` reads ``held``).
                    cached = held[wid] = 0
                uncached = (prompt - (cached if cached > restorable else restorable)) * per_char
                extra = 0.0
                if rate and uncached > 0.0:
                    behind = rate * (backlog + uncached * prefill_s)
                    extra = uncached * (behind if behind < cap else cap)
                life = 0.0 if wid == home else away
                if evict and (uncached > 0.0 or life > 0.0):
                    # KV of sessions away on a tool call, expected back
                    # (``core.toolcalls``), is taken: it fills the cache, and evicting it
                    # is certain to cost.
                    share, fill = 0.0, fill_of(wid, 0.0)
                    reserved, capacity = w.kv_reserved_tokens, w.kv_capacity_tokens
                    if reserved and capacity:
                        share = reserved / capacity if reserved < capacity else 1.0
                        fill += share
                    if fill > 0.0:
                        new = uncached if uncached > life else life
                        extra += evict * evicted_tokens(new, fill, reuse, share)
                if engine:  # the engine's own queue blended with the book
                    cost = speed.predict(wid, uncached, now, in_flight=w.in_flight,
                                         waiting=w.waiting, running=w.running,
                                         extra=extra)  # fmt: skip
                elif reports:  # an engine's slots: the wait for one (``FleetSpeed``)
                    cost = speed.predict(wid, uncached, now, in_flight=w.in_flight, extra=extra)
                else:  # ``FleetSpeed.predict`` on the look: in flight is a floor
                    floor = w.in_flight - unstarted
                    cost = (
                        sp.overhead_s
                        + prefill_s * (queued + uncached + extra)
                        + sp.decode_s * (decoding if decoding > floor else floor)
                        + sp.queue_s * unstarted
                    )
                out.append((cost, w))
            return out

        scored = costs(open_, seen)
        best = self._least(scored, ctx)
        # A claim the index cannot vouch for (sent more than a KV turnover ago) only raises
        # a cost: judge the cheapest's, then the next cheapest's if it lost its place.
        judged: set[WorkerId] = set()
        while best.id not in judged:
            wid = best.id
            judged.add(wid)
            kept = self.residency.resident(request, wid)
            if kept is None or kept >= held_get(wid, 0):
                break
            held[wid] = kept
            at = next(i for i, (_, w) in enumerate(scored) if w is best)
            scored[at] = costs([best], [seen[at]])[0]
            best = self._least(scored, ctx)
        self._scored = scored
        return best

    def _least(self, scored: list[tuple[float, WorkerState]], ctx: RouteContext) -> WorkerState:
        """The worker of least cost in ``scored`` (non-empty; ties: ``_tie``)."""
        best, best_cost = scored[0][1], float("inf")
        for c, w in scored:
            if c < best_cost:
                best, best_cost = w, c
            elif c == best_cost and self._tie(w, ctx) < self._tie(best, ctx):
                best = w
        return best

    @staticmethod
    def _tie(worker: WorkerState, ctx: RouteContext) -> tuple[bool, int, str]:
        """Order among equal costs: the session's home, then the fewest requests, then id."""
        home = ctx.affinity.worker if ctx.affinity is not None else None
        return (worker.id != home, worker.in_flight, worker.id)

    def hold_worth(self, request: RequestFeatures, worker: WorkerId, ctx: RouteContext) -> Seconds:
        """How much sooner ``request`` is predicted to start on ``worker`` than on the best
        other candidate by the same cost (0: it is not the cheaper), the wait for KV room
        left out: the KV hold waits only for a worker worth it (``core.route``)."""
        held = self.residency.held(request, ctx)
        pool = self._candidates(request, ctx, held)
        if len(pool) < 2:
            return 0.0
        opens = self._last[2] if self._last[0] == request.request_id else False
        self._place(request, pool, ctx, held, self._restorable(request), opens=opens)
        mine = min((c for c, w in self._scored if w.id == worker), default=None)
        other = min((c for c, w in self._scored if w.id != worker), default=None)
        if mine is None or other is None or other < mine:
            return 0.0
        return other - mine
