"""The shared prefixes recent openings matched: what ``default``'s warm-ups copy.

An opening (a request that starts a conversation) whose chain matched at least
``least_blocks`` blocks on some worker found a shared prefix: a system prompt, a
tool preamble, a document. ``Openers`` keeps the newest ``limit`` such prefixes,
one per prefix, each as the opening itself cut to it (a headerless opening of the
same size, so it can be placed again as the next opening behind the prefix would
be: ``DefaultPolicy.warm_up``), and names the warm-ups it gives out.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import WorkerState
from kvgate.core.warmup import WarmUp
from kvgate.types import BlockHash, WorkerId

OPENERS = 8
"""Shared prefixes kept: the drivers keep one request body each (``core.warmup``)."""


class Openers:
    """The newest shared prefixes openings matched, one per prefix (by its last block)."""

    def __init__(self, least_blocks: int, limit: int = OPENERS) -> None:
        self.least_blocks = least_blocks
        self.limit = limit
        self._by_end: OrderedDict[BlockHash, RequestFeatures] = OrderedDict()
        self._given = 0

    def note(self, request: RequestFeatures, depth: int) -> None:
        """The opening ``request`` matched ``depth`` blocks of its chain on some worker
        (a request on the hot path: a prefix already kept only moves to the newest)."""
        if not self.least_blocks or depth < self.least_blocks:
            return
        by_end, end = self._by_end, request.prefix_hashes[depth - 1]
        if end in by_end:  # a known prefix: its first opening stays (its body is kept)
            by_end.move_to_end(end)
            return
        by_end[end] = dataclasses.replace(
            request,
            prefix_hashes=request.prefix_hashes[:depth],
            session_key=None,
            restorable_blocks=0,
        )
        if len(by_end) > self.limit:
            by_end.popitem(last=False)

    def ids(self) -> list[str]:
        """The request ids of the openings kept."""
        return [opening.request_id for opening in self._by_end.values()]

    def newest_first(self) -> Iterator[RequestFeatures]:
        """The openings kept, cut to their shared prefixes, newest first (a copy: the
        caller may note more while it iterates)."""
        return reversed(list(self._by_end.values()))

    def next_copy(
        self,
        workers: Iterable[WorkerState],
        *,
        holds: Callable[[RequestFeatures], int],
        place: Callable[[RequestFeatures], WorkerState | None],
        held: Callable[[RequestFeatures, WorkerId], int],
        idle: Callable[[WorkerState], bool],
        chars: Callable[[int], int],
    ) -> WarmUp | None:
        """The warm-up to send now, if any: for each opening kept, newest first, whose
        whole prefix the worker just placed on ``holds`` (blocks of it), where the policy
        would ``place`` it now; when that worker ``held`` less than the prefix and is
        ``idle``, the next opening behind it would copy it there, so it is copied ahead
        (``chars``: a prefix's characters from its blocks). One warm-up at most; none,
        and no placing again, while none of ``workers`` is idle (a busy fleet pays nothing)."""
        if not self._by_end or not any(map(idle, workers)):
            return None
        for opening in self.newest_first():
            depth = len(opening.prefix_hashes)
            if holds(opening) < depth:
                continue
            best = place(opening)
            if best is None:
                return None  # no worker may take an opening now
            if held(opening, best.id) >= depth or not idle(best):
                continue  # it would go where the prefix is, or the copy would delay others
            return self.warm_up(opening, best.id, min(chars(depth), opening.prompt_chars))
        return None

    def warm_up(self, opening: RequestFeatures, worker: WorkerId, chars: int) -> WarmUp:
        """A warm-up of ``opening``'s shared prefix (its first ``chars`` characters) on
        ``worker``, with a request id of its own."""
        self._given += 1
        rid = f"{opening.request_id}~warm{self._given}"
        prefix = dataclasses.replace(opening, request_id=rid, prompt_chars=chars)
        return WarmUp(worker, prefix, opening.request_id)
