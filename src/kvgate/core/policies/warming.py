"""``Warming``: the warm-up hooks of ``default`` (``core.warmup``), a base of ``DefaultPolicy``.

After each placement the policy places again the newest openings behind each shared
prefix the worker holds (``Openers``); where the next one would copy that prefix to an
idle worker, the driver sends that worker the prefix alone, ahead of the opening. The
warm-up is queued and indexed as a request is, and its usage corrects the index.

The placement itself, the prefix index and the queue estimate are ``DefaultPolicy``'s:
this base names what it reads of them and leaves them to it.
"""

from __future__ import annotations

from collections.abc import Collection

from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import WorkerState
from kvgate.core.policies.base import candidates, under_threshold
from kvgate.core.policies.books import Queues
from kvgate.core.policies.default_config import DefaultConfig
from kvgate.core.policies.openers import Openers
from kvgate.core.policies.prefix_affinity import PrefixLearning
from kvgate.core.policies.residency import Residency
from kvgate.core.policy import RouteContext
from kvgate.core.warmup import WarmUp
from kvgate.types import Seconds, WorkerId


class Warming(Residency):
    """Warm-ups for a policy that places by ``_aside`` and keeps a ``Queues`` estimate."""

    config: DefaultConfig
    _openers: Openers
    _queues: Queues
    _tokens_per_char: float

    def _aside(
        self, request: RequestFeatures, pool: list[WorkerState], ctx: RouteContext, *, opening: bool
    ) -> WorkerState:
        """Where the policy would place ``request`` in ``pool``, remembering nothing of it."""
        raise NotImplementedError

    def _refill(self, worker: WorkerId, now: Seconds) -> None:
        """Tell the books how full ``worker``'s cache is, and of how many tokens."""
        index = self.index
        room = index.kv_blocks(worker) * index.config.block_chars * self._tokens_per_char
        self._queues.refill(worker, index.fill(worker), room, now)

    def openers(self) -> Collection[str]:
        """Ids of the openings whose shared prefixes a warm-up may copy (``Openers``)."""
        return self._openers.ids()

    def warm_up(self, worker: WorkerId, ctx: RouteContext) -> WarmUp | None:
        """After a placement on ``worker``: if the next opening behind a shared prefix
        it holds would now copy that prefix to an idle worker, warm that one ahead
        (``Openers.next_copy``: each opening kept is placed again by ``_place``)."""
        cfg = self.config
        if not cfg.warm_min_blocks:
            return None

        def place(probe: RequestFeatures) -> WorkerState | None:
            kind, limit = cfg.threshold_kind, cfg.threshold
            pool = [w for w in candidates(probe, ctx) if under_threshold(w, kind, limit)]
            return self._aside(probe, pool, ctx, opening=True) if pool else None

        now = ctx.fleet.now
        index, queued = self.index, self._queues.queued_tokens
        return self._openers.next_copy(
            ctx.fleet.workers,
            holds=lambda probe: index.match_worker(probe.prefix_hashes, worker),
            place=place,
            held=lambda probe, w: self.matches(probe, ctx).get(w, 0),
            idle=lambda w: not (w.in_flight + (w.waiting or 0) or queued(w.id, now)),
            chars=index.depth_chars,
        )

    def on_warm(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """A warm-up (``request``: its prefix) was sent to ``worker``: queue and index it."""
        tokens = request.prompt_chars * self._tokens_per_char
        self._queues.routed(request.request_id, worker, tokens, request.prefix_hashes, now)
        PrefixLearning.on_routed(self, request, worker, now)
        self._refill(worker, now)

    def on_warm_done(
        self,
        request: RequestFeatures,
        worker: WorkerId,
        prompt_tokens: int,
        cached_tokens: int,
        now: Seconds,
    ) -> None:
        """The warm-up ended (``prompt_tokens`` 0: it failed): it leaves the queue, and its
        usage corrects the index as a request's does."""
        self._queues.reported(request.request_id)
        if prompt_tokens:
            PrefixLearning.on_usage(self, request, worker, prompt_tokens, cached_tokens, now)
        self._refill(worker, now)
