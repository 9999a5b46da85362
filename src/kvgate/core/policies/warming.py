"""``Warming``: the warm-up hooks of ``default`` (``core.warmup``), a base of ``DefaultPolicy``.

After each placement the newest openings behind each shared prefix the worker holds are
placed again (``Openers``: the newest ``limit`` prefixes openings matched at least
``least_blocks`` of, shared once ``SHARED`` openings' matches end at one); where the next
would copy the prefix to an idle worker, that worker is sent the prefix alone, ahead of
it, queued and indexed as a request is (``docs/dev/default.md``). Also the fill a placement
is charged (``_refill``).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import WorkerState
from kvgate.core.policies.base import candidates, under_threshold
from kvgate.core.policies.learning import CostLearning
from kvgate.core.policies.prefix_affinity import PrefixLearning
from kvgate.core.policy import RouteContext
from kvgate.core.speed import IDLE_BOOK, Book
from kvgate.core.warmup import WarmUp
from kvgate.types import BlockHash, Seconds, WorkerId

if TYPE_CHECKING:
    from kvgate.core.policies.default import DefaultConfig

OPENERS = 8
"""Prefixes kept: the drivers keep one request body each (``core.warmup``)."""

SHARED = 2
"""Openings whose matches must end at a prefix before it is warmed (module docs)."""


class Openers:
    """The newest prefixes openings matched, one per prefix (by its last block)."""

    def __init__(self, least_blocks: int, limit: int = OPENERS) -> None:
        self.least_blocks = least_blocks
        self.limit = limit
        # Per prefix: its first opening, the prefix's blocks, and that opening cut to them
        # once asked for (a copy of the features: made on the warm-up path, not on every
        # placement).
        self._by_end: OrderedDict[BlockHash, tuple[RequestFeatures, int, RequestFeatures | None]]
        self._by_end = OrderedDict()
        self._matched: dict[BlockHash, int] = {}  # openings that matched each kept prefix
        self._given = 0

    def note(self, request: RequestFeatures, depth: int) -> None:
        """The opening ``request`` matched ``depth`` blocks of its chain on some worker
        (a request on the hot path: a prefix already kept only moves to the newest)."""
        if not self.least_blocks or depth < self.least_blocks:
            return
        by_end, end = self._by_end, request.prefix_hashes[depth - 1]
        if end in by_end:  # a known prefix: its first opening stays (its body is kept)
            by_end.move_to_end(end)
            self._matched[end] += 1
            return
        by_end[end] = (request, depth, None)
        self._matched[end] = 1
        if len(by_end) > self.limit:
            del self._matched[by_end.popitem(last=False)[0]]

    def ids(self) -> list[str]:
        """The request ids of the openings kept."""
        return [opening.request_id for opening, _, _ in self._by_end.values()]

    def newest_first(self) -> Iterator[RequestFeatures]:
        """The openings kept whose prefixes are shared, cut to them, newest first (a
        copy: the caller may note more while it iterates)."""
        matched = self._matched
        shared = [end for end in self._by_end if matched[end] >= SHARED]
        return reversed([self._cut(end) for end in shared])

    def _cut(self, end: BlockHash) -> RequestFeatures:
        """The first opening that matched the prefix ending at ``end``, cut to it: a
        headerless opening of the prefix's blocks."""
        opening, depth, cut = self._by_end[end]
        if cut is None:
            cut = dataclasses.replace(
                opening,
                prefix_hashes=opening.prefix_hashes[:depth],
                session_key=None,
                restorable_blocks=0,
            )
            self._by_end[end] = (opening, depth, cut)
        return cut

    def warm_up(self, opening: RequestFeatures, worker: WorkerId, chars: int) -> WarmUp:
        """A warm-up of ``opening``'s prefix (its first ``chars`` characters) on ``worker``."""
        self._given += 1
        rid = f"{opening.request_id}~warm{self._given}"
        prefix = dataclasses.replace(opening, request_id=rid, prompt_chars=chars, slot_uncached=())
        return WarmUp(worker, prefix, opening.request_id)


class Warming(CostLearning):
    """Warm-ups for a policy that places by ``_aside`` and books its requests in ``speed``."""

    config: DefaultConfig
    _openers: Openers
    _fills: dict[WorkerId, tuple[float, float]]  # ``PrefixIndex.fill`` and KV room in tokens
    charged: dict[WorkerId, tuple[float, Book, float, float]]
    """The fill charged (at most what was sent lately fills), the book, and ``_place``'s
    ``fill × pace`` and ``pace × (1 − fill)`` (``_paced``): one look-up a worker."""
    _aged_at: Seconds

    def _aside(
        self, request: RequestFeatures, pool: list[WorkerState], ctx: RouteContext, *, opening: bool
    ) -> WorkerState:
        """Where the policy would place ``request`` in ``pool``, remembering nothing of it."""
        raise NotImplementedError

    def _refill(self, worker: WorkerId, now: Seconds) -> None:
        """How full ``worker``'s cache is now, of how many tokens: charged (``_charge``)."""
        index = self.index
        room = index.kv_blocks(worker) * index.config.block_chars * self._tokens_per_char
        self._fills[worker] = (index.fill(worker), room)
        self._charge(worker, now)

    def _charge(self, worker: WorkerId, now: Seconds) -> None:
        """Charge ``worker`` its fill as of ``now``, at most what the uncached tokens it was
        sent lately (``FleetSpeed.lately``) fill of its room."""
        fill, room = self._fills[worker]
        if room > 0.0:
            lately = self.speed.lately(worker, now)[1] / room
            fill = lately if lately < fill else fill
        self._paced(worker, fill, self.speed.books.get(worker, IDLE_BOOK))

    def _paced(self, worker: WorkerId, fill: float, book: Book) -> None:
        """Charge ``worker`` ``fill`` at the pace: the engines' own rate over the prior's."""
        pace = self.speed.prior_of(None).prefill_s / self.speed.prior.prefill_s
        self.charged[worker] = fill, book, fill * pace, pace * (1.0 - fill)

    def _age(self, now: Seconds) -> None:
        """Every ``half_s / 16``, every worker is charged again as of ``now``."""
        if now >= self._aged_at + self.speed.half_s / 16.0:
            self._aged_at = now
            for worker in self._fills:
                self._charge(worker, now)

    def openers(self) -> Collection[str]:
        """Ids of the openings whose shared prefixes a warm-up may copy (``Openers``)."""
        return self._openers.ids()

    def warm_up(self, worker: WorkerId, ctx: RouteContext) -> WarmUp | None:
        """After a placement on ``worker``: for each shared prefix kept that it holds whole,
        newest first, where ``_aside`` would place the next opening behind it now; if that
        worker lacks the prefix and is idle, the prefix is copied there ahead. One warm-up
        at most; none, and no placing again, while no worker is idle."""
        cfg, now, index, openers = self.config, ctx.fleet.now, self.index, self._openers

        def idle(w: WorkerState) -> bool:
            return not (w.in_flight + (w.waiting or 0) or self.speed.queue(w.id, now)[0])

        if not cfg.warm_min_blocks or not openers.ids() or not any(map(idle, ctx.fleet.workers)):
            return None
        kind, limit = cfg.threshold_kind, cfg.threshold
        for opening in openers.newest_first():
            depth = len(opening.prefix_hashes)
            if index.match_worker(opening.prefix_hashes, worker) < depth:
                continue
            pool = [w for w in candidates(opening, ctx) if under_threshold(w, kind, limit)]
            if not pool:
                return None  # no worker may take an opening now
            best = self._aside(opening, pool, ctx, opening=True)
            if self.residency.matches(opening, ctx).get(best.id, 0) >= depth or not idle(best):
                continue  # it would go where the prefix is, or the copy would delay others
            chars = min(index.depth_chars(depth), opening.prompt_chars)
            return openers.warm_up(opening, best.id, chars)
        return None

    def on_warm(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """A warm-up (``request``: its prefix) was sent to ``worker``: queue and index it."""
        tokens = request.prompt_chars * self._tokens_per_char
        self.speed.sent(request.request_id, worker, now, tokens)
        self._running.fly(request.request_id, worker, request.prefix_hashes)
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
        self.speed.ended(request.request_id, prompt_tokens, cached_tokens)
        self._running.landed(request.request_id)
        if prompt_tokens:
            PrefixLearning.on_usage(self, request, worker, prompt_tokens, cached_tokens, now)
        self._refill(worker, now)
