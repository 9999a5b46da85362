"""``default``: sessions stick; new work goes where its first token comes soonest.

Used when the config names no policy. In order:

1. A request with the client's own session id (header or ``user``) whose
   binding (``ctx.affinity``) names a worker that is routable, not under hard
   pressure, under the sticky threshold and holding at most ``ceil(
   sticky_load_factor × mean load) + sticky_slack`` requests stays there:
   ``affinity_hit``. Nothing else binds: without a session id a request has no
   key, and is followed by its own prefix chain (a conversation's later turns
   extend it), never by a key derived from text strangers share.
2. Everything else is *placed* on the worker with the lowest cost, where a
   worker's cost is its expected time to first token for this request::

       ttft = (queued prefill tokens + this request's uncached tokens)
              / prefill_tokens_per_s × (1 + kv_slowdown × kv use)
              + requests on it × decode_s
       cost = ttft + evict × uncached seconds × fill − pull

   ``fill`` is how full the worker's cache is (its share of the prefix index,
   sized from its KV capacity): new blocks on a full cache evict blocks that
   later requests would have hit, so fresh content goes where there is room, and
   a cold-start opening cannot pack every new conversation onto the two workers
   that computed it first while the others' caches stay empty. The ``pull`` of a
   cache is ``stay × cached tokens / prefill_tokens_per_s``, decayed by
   ``1 / (1 + queued seconds / busy_half_s)``. The cached tokens are
   the longest match of the whole prompt's chain, from this replica's prefix
   index or the shared store's prefix state (``ctx.holders``), so a long cached
   match weighs what it saves. The pull keeps work on a warm worker a little
   past the point where recomputing elsewhere would tie (its cache will serve
   the conversation's next turns too), and fades as the warm worker's queue
   grows, so a cache-rich but busy worker cannot win forever. That is herding
   prevention as its own mechanism: work leaves a warm worker when its expected
   TTFT is clearly worse than recomputing elsewhere, whatever the request counts.

   Load is counted in what it costs a request: queued prefill tokens, KV use,
   requests in flight. The queue is this policy's own estimate: each routed
   request adds its uncached tokens to its worker's queue, which drains at
   ``prefill_tokens_per_s`` and is never more than the uncached tokens of the
   requests still in flight there (so a wrong rate cannot make it drift).
   Workers at ``kv_high`` KV use are skipped unless all are.

   Reasons: ``prefix_match`` (the worker with the longest match), ``least_ttft``
   (a colder worker: the warm one's queue outweighed its cache),
   ``least_loaded`` (nothing of the prompt cached anywhere). A session that had
   to leave its worker says why (``affinity_{overloaded,lost,pressure,
   version}_migrated``) and is bound where it goes (``AffinityWrite`` with
   ``expected`` the old worker); a new session is bound where it is placed.

Bursts of siblings (requests sharing a long new prefix, arriving together) land
together without a side index: a routed chain is in the index at once, before
the worker has computed it, and the queue estimate says when that worker will
be done with it.

Example::

    policy: default
    options:
      threshold_kind: fraction
      threshold: 0.8
      sticky_load_factor: 2.0
      prefill_tokens_per_s: 12000
      decode_s: 0.002
      kv_slowdown: 0.25
      stay: 0.5
      busy_half_s: 1.0
      evict: 1.0
      kv_high: 0.9
"""

from __future__ import annotations

import math
from collections import OrderedDict

from pydantic import Field

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import WorkerState
from kvgate.core.hashing import bounded_load_cap
from kvgate.core.policies.base import (
    PolicyConfig,
    ThresholdKind,
    affinity_status,
    candidates,
    refuse,
    route,
    under_threshold,
)
from kvgate.core.policies.prefix_affinity import PrefixLearning
from kvgate.core.policy import RouteContext
from kvgate.core.prefix_index import PrefixIndexConfig
from kvgate.types import Seconds, WorkerId


class DefaultConfig(PolicyConfig):
    """Options of ``default``: session stickiness and the expected-TTFT cost model."""

    threshold_kind: ThresholdKind = "fraction"
    threshold: float = Field(default=0.8, gt=0)
    sticky_load_factor: float | None = Field(default=2.0, ge=1)
    sticky_slack: int = Field(default=4, ge=0)
    prefill_tokens_per_s: float = Field(default=12_000.0, gt=0)
    """One worker's prefill rate (an H100 running an 8B model does 10-15k tokens/s)."""
    decode_s: float = Field(default=0.002, ge=0)
    """Time to first token each request already on a worker adds (its decode steps)."""
    kv_slowdown: float = Field(default=0.25, ge=0)
    """How much slower prefill runs at full KV use (attention over running contexts)."""
    stay: float = Field(default=0.5, ge=0)
    """The pull of a warm worker, as a fraction of the prefill seconds its cache saves."""
    busy_half_s: float = Field(default=1.0, gt=0)
    """Queued prefill seconds at which the pull of a worker's cache is halved."""
    evict: float = Field(default=1.0, ge=0)
    """Weight of the cache a request's new blocks would evict, per prefill second, when full."""
    kv_high: float = Field(default=0.9, gt=0, le=1)
    recent_half_life_s: float = Field(default=60.0, gt=0)
    """Half-life of the per-worker count of recently routed requests (a tie-break)."""
    outstanding_horizon_s: float = Field(default=600.0, gt=0)
    """A routed request never reported back is dropped from the queue estimate after this."""
    index: PrefixIndexConfig = PrefixIndexConfig()


class DefaultPolicy(PrefixLearning):
    """Sticky explicit sessions; everything else placed by expected time to first token."""

    name = "default"

    def __init__(self, config: DefaultConfig | None = None) -> None:
        self.config = config if config is not None else DefaultConfig()
        super().__init__(self.config.index)
        cfg = self.config
        self._tokens_per_char = 1.0 / cfg.index.chars_per_token
        # Per worker: when its queued prefill is done (virtual time), and the
        # uncached tokens of the requests routed there and not yet reported back.
        self._busy_until: dict[WorkerId, float] = {}
        self._owed: dict[WorkerId, float] = {}
        self._flights: OrderedDict[str, tuple[WorkerId, float, Seconds]] = OrderedDict()
        # Requests routed to each worker, decayed: (count, as of when). Among equal
        # costs new work goes to the one that got least lately.
        self._recent: dict[WorkerId, tuple[float, Seconds]] = {}

    # -- learning -----------------------------------------------------------------

    def queued_tokens(self, worker: WorkerId, now: Seconds) -> float:
        """The prefill tokens ``worker`` is estimated to still have queued at ``now``."""
        drain = max(0.0, self._busy_until.get(worker, 0.0) - now) * self.config.prefill_tokens_per_s
        return min(drain, self._owed.get(worker, 0.0))

    def _recent_count(self, worker: WorkerId, now: Seconds) -> float:
        entry = self._recent.get(worker)
        if entry is None:
            return 0.0
        count, at = entry
        return count * math.exp2(-max(0.0, now - at) / self.config.recent_half_life_s)

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """Queue the request's uncached tokens on ``worker``, then index its chain there."""
        cfg = self.config
        depth = self.index.match_worker(request.prefix_hashes, worker)
        cached = min(request.prompt_chars, self.index.depth_chars(depth))
        uncached = (request.prompt_chars - cached) * self._tokens_per_char
        start = max(self._busy_until.get(worker, now), now)
        self._busy_until[worker] = start + uncached / cfg.prefill_tokens_per_s
        self._owed[worker] = self._owed.get(worker, 0.0) + uncached
        flights = self._flights
        old = flights.pop(request.request_id, None)
        if old is not None:
            self._settle(old)
        flights[request.request_id] = (worker, uncached, now)
        while flights:
            first = next(iter(flights.values()))
            if (
                first[2] >= now - cfg.outstanding_horizon_s
                and len(flights) <= cfg.index.max_pending
            ):
                break
            self._settle(flights.popitem(last=False)[1])
        self._recent[worker] = (self._recent_count(worker, now) + 1.0, now)
        super().on_routed(request, worker, now)

    def on_usage(
        self,
        request: RequestFeatures,
        worker: WorkerId,
        prompt_tokens: int,
        cached_tokens: int,
        now: Seconds,
    ) -> None:
        """The request is done: its tokens leave the queue bound; correct the index."""
        flight = self._flights.pop(request.request_id, None)
        if flight is not None:
            self._settle(flight)
        super().on_usage(request, worker, prompt_tokens, cached_tokens, now)

    def _settle(self, flight: tuple[WorkerId, float, Seconds]) -> None:
        worker, tokens, _ = flight
        left = self._owed.get(worker, 0.0) - tokens
        self._owed[worker] = left if left > 1e-6 else 0.0

    def on_worker_removed(self, worker: WorkerId) -> None:
        """Forget the worker's blocks, queue and counts."""
        super().on_worker_removed(worker)
        self._busy_until.pop(worker, None)
        self._owed.pop(worker, None)
        self._recent.pop(worker, None)

    # -- deciding -----------------------------------------------------------------

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """Stay (explicit sessions), or place by expected TTFT, or refuse; see the module docs."""
        cfg = self.config
        cands = candidates(request, ctx)
        sticky_cap = None
        if ctx.affinity is not None and cands and cfg.sticky_load_factor is not None:
            total = sum([w.in_flight + (w.waiting or 0) for w in cands])  # ``load``, inlined
            sticky_cap = bounded_load_cap(
                total, len(cands), cfg.sticky_load_factor, cfg.sticky_slack
            )
        bound, why = affinity_status(request, ctx, cfg.threshold_kind, cfg.threshold, sticky_cap)
        if bound is not None:
            return route(bound, "affinity_hit")
        if not cands:
            return refuse(request, ctx, cfg.retry_after_s)

        old = ctx.affinity.worker if ctx.affinity is not None else None
        pool = cands
        if old is not None:
            pool = [
                w
                for w in cands
                if w.id != old and under_threshold(w, cfg.threshold_kind, cfg.threshold)
            ]
            if not pool:
                return Decision.refuse("capacity_full", cfg.retry_after_s)

        worker, reason = self._place(request, pool, ctx)
        self._remember_capacity(worker)
        if why != "new":
            reason = f"affinity_{why}_migrated"
        keyed = request.session_key is not None
        return route(worker, reason, request if keyed else None, expected=old)

    def matches(self, request: RequestFeatures, ctx: RouteContext) -> dict[WorkerId, int]:
        """Blocks of the request's chain each worker holds: the index's or the store's, deeper."""
        hashes = request.prefix_hashes
        found = self.index.match(hashes) if hashes else {}
        for worker, depth in ctx.holders.items():
            if depth > found.get(worker, 0):
                found[worker] = min(depth, len(hashes))
        return found

    def _place(
        self, request: RequestFeatures, pool: list[WorkerState], ctx: RouteContext
    ) -> tuple[WorkerState, str]:
        """The worker of lowest cost (expected TTFT minus its cache's pull); see the module docs."""
        cfg = self.config
        now = ctx.fleet.now
        matches = self.matches(request, ctx)
        rate = cfg.prefill_tokens_per_s
        per_char = self._tokens_per_char / rate  # prefill seconds per prompt character
        prompt = request.prompt_chars
        depth_chars = self.index.depth_chars
        busy_until = self._busy_until
        owed = self._owed
        get = matches.get
        kv_high = cfg.kv_high
        fill = self.index.fill
        evict = cfg.evict
        best: WorkerState | None = None
        best_cost = math.inf
        best_tie: tuple[int, float, float, str] | None = None
        # Two passes at most: the second admits workers at kv_high when all are.
        for admit_high in (False, True):
            for w in pool:
                kv = w.kv_usage or 0.0
                if kv >= kv_high and not admit_high:
                    continue
                depth = get(w.id, 0)
                cached = min(prompt, depth_chars(depth)) if depth else 0
                queued = max(0.0, busy_until.get(w.id, 0.0) - now)
                owed_s = owed.get(w.id, 0.0) / rate
                queued = min(queued, owed_s)
                load = max(w.in_flight, (w.running or 0) + (w.waiting or 0))
                fresh = (prompt - cached) * per_char
                ttft = (queued + fresh) * (1.0 + cfg.kv_slowdown * kv)
                cost = ttft + load * cfg.decode_s
                if evict and fresh:
                    cost += evict * fresh * fill(w.id)
                if cached:
                    cost -= cfg.stay * cached * per_char / (1.0 + queued / cfg.busy_half_s)
                if cost < best_cost - 1e-12:
                    best, best_cost, best_tie = w, cost, None
                elif best is not None and cost <= best_cost + 1e-12:
                    # Near-exact ties are common at low load: only then order them.
                    if best_tie is None:
                        best_tie = self._tie(best, now)
                    tie = self._tie(w, now)
                    if tie < best_tie:
                        best, best_tie = w, tie
            if best is not None:
                break
        assert best is not None  # ``pool`` is non-empty
        top = max(matches.values(), default=0)
        if not top:
            return best, "least_loaded"
        return best, "prefix_match" if get(best.id, 0) == top else "least_ttft"

    def _tie(self, worker: WorkerState, now: Seconds) -> tuple[int, float, float, str]:
        """Order among equal costs: load, recent requests, KV usage, id."""
        return (worker.load, self._recent_count(worker.id, now), worker.kv_usage or 0.0, worker.id)
