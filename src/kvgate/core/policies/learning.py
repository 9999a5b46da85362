"""``SpeedLearning``: a policy's hooks that keep a ``core.speed.FleetSpeed`` fed.

A base for policies that learn each worker's speed from what the drivers measure of every
attempt (``Policy.on_first_token``, ``Policy.on_observed``) and report it (``speeds``: the
learned rates and the TTFT prediction error ``/metrics`` and the dashboard show). The
policy books each request it routes (``FleetSpeed.sent``) and closes it on its usage
(``FleetSpeed.ended``) or drop (``FleetSpeed.dropped``), where it knows its uncached tokens.
``Replies``: a session's last reply, cached on its worker though the index never saw it.
``CostLearning`` and ``CostConfig``: the books and options both policies that cost a
placement in seconds (``default``, ``ttft``) keep.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from pydantic import Field

from kvgate.core.features import RequestFeatures
from kvgate.core.policies.base import PolicyConfig
from kvgate.core.policies.caches import IndexResidency
from kvgate.core.policies.prefix_affinity import PrefixLearning
from kvgate.core.policies.running import RunningBlocks
from kvgate.core.policy import PolicyBase
from kvgate.core.prefix_index import PrefixIndexConfig
from kvgate.core.speed import FleetSpeed, Observation, SpeedReport
from kvgate.types import Seconds, SessionKey, WorkerId


class Replies:
    """Where each session's last turn ended: its worker and the characters through its reply.

    An engine keeps the KV of what it generated, and a session's next turn re-sends the
    reply after its earlier prompt: cached there, though the index (built from prompts)
    never saw it. Counted, session-docs' later turns were predicted hundreds of tokens
    uncached that took ~1.5 ms (TTFT prediction error 92%). The last ``limit`` sessions.
    """

    __slots__ = ("_ends", "limit")

    def __init__(self, limit: int = 65_536) -> None:
        self.limit = limit
        self._ends: OrderedDict[SessionKey, tuple[WorkerId, int]] = OrderedDict()

    def cached(self, request: RequestFeatures, worker: WorkerId) -> int:
        """Characters of ``request``'s prompt ``worker`` holds through its session's last
        reply (0: no session, or its last turn went elsewhere)."""
        key = request.session_key
        end = self._ends.get(key) if key is not None else None
        if end is None or end[0] != worker:
            return 0
        return min(end[1], request.prompt_chars)

    def replied(self, request: RequestFeatures, worker: WorkerId, chars: int) -> None:
        """``request``'s turn on ``worker`` ended with a reply of ``chars`` characters."""
        key = request.session_key
        if key is None:
            return
        ends = self._ends
        ends[key] = (worker, request.prompt_chars + chars)
        ends.move_to_end(key)
        if len(ends) > self.limit:
            ends.popitem(last=False)


class SpeedLearning(PolicyBase):
    """Feeds ``speed`` the first tokens and TTFTs the drivers observe."""

    speed: FleetSpeed
    learn: bool = True
    """Whether observed TTFTs move the fit (off: the prior stands, the book is still kept)."""
    engine_seconds: float = 1.0
    """The engine's seconds per driver second (an emulated fleet's time scale): an engine's
    own TTFT, where it reports one, is read in the driver's clock through it."""

    def on_first_token(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """Its prefill is done: it no longer queues ahead of others."""
        self.speed.first_token(request.request_id, now)

    def on_observed(
        self, request: RequestFeatures, worker: WorkerId, observed: Observation, now: Seconds
    ) -> None:
        """Fit ``worker``'s speed to the attempt's TTFT: the engine's own where it reports
        one (the worker's speed, without the network's and the gateway machine's time),
        else the gateway's, from the send."""
        if self.learn:
            engine = observed.engine_ttft
            if engine is None:
                self.speed.observed(request.request_id, observed.ttft)
            else:
                ttft, seen = engine / self.engine_seconds, observed.ttft
                self.speed.observed(request.request_id, ttft, seen=seen)
        if observed.itl is not None and observed.completion_tokens > 1:
            # How long it decoded: with its prefill, how long it held an engine slot.
            decoded = observed.itl * (observed.completion_tokens - 1)
            self.speed.held(request.request_id, decoded)

    def speeds(self) -> Mapping[WorkerId, SpeedReport]:
        """Each worker's learned speed and TTFT prediction error (``core.speed``)."""
        return self.speed.report()


class CostConfig(PolicyConfig):
    """The options of a policy that costs each placement in seconds (``default``, ``ttft``)."""

    prefill_tokens_per_s: float = Field(default=12_000.0, gt=0)
    """The prior of a worker's prefill rate (an H100 running an 8B model does 10-15k
    tokens/s), the engines' own measure where they report one (llama.cpp's ``/metrics``:
    ``FleetSpeed.prior_of``)."""
    evict: float = Field(default=1.0, ge=0)
    """Weight of the predicted cost of what a placement's new KV evicts (0: not counted)."""
    time_scale: float = Field(default=1.0, gt=0)
    """Model seconds per second of the driver's clock: the rates and times set are the
    model's, and an emulated fleet run ``--time-scale 10`` does ten model seconds a second."""
    restorable_credit: float = Field(default=0.9, ge=0, le=1)
    """What a prefix block restorable from disk is worth on any worker, against one in
    the worker's own cache (1): llama.cpp restores a saved slot in 2-15% of the time it
    takes to recompute it (``benchmarks/real_offload.py``)."""


class CostLearning(PrefixLearning, SpeedLearning):
    """What a policy that costs each placement in seconds keeps of the requests it routes:
    their chains in the index, their uncached tokens in ``speed``'s book, the chains in
    flight per worker, a session's last reply (``Replies``), until their usage or drop."""

    def __init__(self, index_config: PrefixIndexConfig) -> None:
        super().__init__(index_config)
        self._tokens_per_char = 1.0 / index_config.chars_per_token
        pending = index_config.max_pending
        # The blocks requests in flight hold on each worker (what a new one need not add to
        # its KV in use: ``Decision.shared_chars``), and each one's worker and chain.
        self._running = RunningBlocks(pending)
        self.residency = IndexResidency(self.index, self._running)
        """Where the prompt is cached (``caches``: KV events, the index, the store)."""
        self._replies = Replies(pending)  # a session's cached reply (TTFT)

    def _book(
        self, request: RequestFeatures, worker: WorkerId, now: Seconds, cached: int, reply: bool
    ) -> None:
        """Book ``request`` on ``worker`` at ``now``, uncached past ``cached`` characters or
        what the slot plane finds there, or (``reply``) its session's last reply there."""
        credit, after = request.slot_credit(worker, self.index.depth_chars)  # llama.cpp's plane
        if reply:
            cached = max(cached, self._replies.cached(request, worker))
        likely = max(request.prompt_chars - max(cached, credit), 0) * self._tokens_per_char
        likely, setup = request.slot_tokens(worker, likely)  # the engine's own, if the plane tells
        rid = request.request_id
        self.speed.sent(rid, worker, now, likely, streamed=request.stream, after=after, setup=setup)
        self._running.fly(rid, worker, request.prefix_hashes)

    def _shared_chars(self, request: RequestFeatures, worker: WorkerId) -> int:
        """Leading characters of the prompt whose KV requests in flight on ``worker`` hold."""
        depth = self._running.shared_depth(worker, request.prefix_hashes)
        if not depth:
            return 0
        chars = self.index.depth_chars(depth)
        return chars if chars < request.prompt_chars else request.prompt_chars

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
        """The request is done: its usage corrects the index, it leaves the books, and a
        session's reply is cached where it went (``Replies``)."""
        super().on_usage(request, worker, prompt_tokens, cached_tokens, now)
        self.speed.ended(request.request_id, prompt_tokens, cached_tokens)
        self._running.landed(request.request_id)
        self._replies.replied(request, worker, int(completion_tokens / self._tokens_per_char))

    def on_dropped(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """No usage will come: the request leaves the books."""
        self.speed.dropped(request.request_id)
        self._running.landed(request.request_id)

    def on_worker_removed(self, worker: WorkerId) -> None:
        """Forget the worker's blocks, book, speed and requests in flight."""
        super().on_worker_removed(worker)
        self.speed.forget_worker(worker)
        self._running.forget(worker)
