"""The shared prefixes recent openings matched: what ``default``'s warm-ups copy.

An opening (a request that starts a conversation) whose chain matched at least
``least_blocks`` blocks on some worker found a prefix an earlier request had: a
system prompt, a tool preamble, a document. ``Openers`` keeps the newest ``limit``
such prefixes, one per prefix (by its last block), each as the first opening
that matched it cut to it (a headerless opening of the same size, so it can be
placed again as the next opening behind the prefix would be:
``DefaultPolicy.warm_up``), and names the warm-ups it gives out.

A prefix is *shared*, and worth a copy ahead, once a second opening's match ends
at it (``SHARED``). One match is what a conversation the gateway cannot follow
makes of its own history: a trace's later turn that rewrites its predecessor's
last block matches that turn's chain and is taken for an opening, and each such
match ends at another block. Warming those copied single conversations' 2-10k
tokens of context to idle workers where no other request would read them (on
the trace shape in the simulator, 25-72k tokens a run and up to 0.9 point of hit
rate). Prompts behind a system prompt or preamble match at the same end again
and again.
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
        """The warm-up to send now, if any: for each shared prefix kept, newest first,
        that the worker just placed on ``holds`` whole (``holds``: blocks of it), where
        the policy would ``place`` it now; when that worker ``held`` less than the prefix and is
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
