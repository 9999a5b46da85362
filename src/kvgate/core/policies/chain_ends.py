"""``ChainEnds``: where recent headerless requests ended, to tell a later turn from an opening.

A headerless request extends a conversation when its chain runs through where another one
routed before ended (marked exactly past its last whole block ``B``); else it opens one. A
later turn finds its earlier turn's prompt and reply cached where that went (its reach).
How and why: ``docs/dev/default.md``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kvgate.core.chain import span_hashes
from kvgate.core.features import RequestFeatures
from kvgate.types import BlockHash, WorkerId

_End = tuple[str, BlockHash, int, WorkerId, int, BlockHash, int]
"""What a mark stands for: the request that ended there, its block ``B``, ``off``, the
worker the request was routed to, and its exact end: the characters past ``B`` (-1: not
known, as of a request without its text), their hash seeded with ``B``, and its reply's
characters (``replied``)."""

Through = tuple[WorkerId, int, int, str]
"""The end a request runs through: the worker the earlier request went to, the whole
blocks of the chain up to ``B``, the characters of the request the earlier one left
cached there (its reach where the texts agree to its exact end; else ``B``'s and
``off``) and the earlier request's id."""


_Where = tuple[BlockHash, int, int, int, BlockHash]
"""Where a request ends (``ChainEnds._end_of``): its mark, its whole blocks, ``off``, and
the characters past ``B`` to its exact end (-1: not known) and their hash."""


class _Past:
    """The marks past one block ``B``: how many at each ``off``, and whose was noted last
    (the request and its worker)."""

    __slots__ = ("count", "last", "offsets", "worker")

    def __init__(self) -> None:
        self.count = 0
        self.last = ""
        self.worker: WorkerId = WorkerId("")
        self.offsets: dict[int, int] = {}


class ChainEnds:
    """The ends of the last ``capacity`` headerless requests routed, oldest first."""

    __slots__ = ("_capacity", "_depth_chars", "_ends", "_fine", "_past")

    def __init__(self, capacity: int, depth_chars: Callable[[int], int]) -> None:
        self._capacity = capacity
        self._depth_chars = depth_chars
        """Characters the first ``n`` blocks of a chain cover (``PrefixIndex.depth_chars``)."""
        self._fine = depth_chars(1)
        # Keyed by mark (the span's hash seeded with ``B``, or ``B``): it names ``B`` too.
        self._ends: OrderedDict[BlockHash, _End] = OrderedDict()
        # ``B`` -> its marks: which spans to hash past a block, if any.
        self._past: dict[BlockHash, _Past] = {}

    def __len__(self) -> int:
        return len(self._ends)

    def _full_blocks(self, request: RequestFeatures) -> int:
        """Blocks of the request's chain that are whole (a trailing partial one is not)."""
        n = len(request.prefix_hashes)
        return n if self._depth_chars(n) <= request.prompt_chars else n - 1

    def opens(self, request: RequestFeatures) -> bool:
        """Whether ``request`` runs through no earlier request's end (see the module docs)."""
        return self.through(request) is None

    def through(self, request: RequestFeatures) -> Through | None:
        """The deepest earlier request's end ``request``'s chain runs through, and where
        that request went (``None``: it opens a conversation). A lone end covers ``B``."""
        ends = self._ends
        if not ends:
            return None
        rid = request.request_id
        hashes = request.prefix_hashes
        blocks = self._past
        pieces, chars = request.prompt_pieces, request.prompt_chars
        for i in range(self._full_blocks(request) - 1, -1, -1):
            block = hashes[i]
            past = blocks.get(block)
            if past is None:
                continue
            start = self._depth_chars(i + 1)
            at = past.offsets
            spans = sorted((off for off in at if off and start + off <= chars), reverse=True)
            marks: list[tuple[BlockHash, int]] = []
            if spans and pieces:  # the deepest first
                marks += zip(span_hashes(pieces, start, spans, block), spans, strict=True)
            if 0 in at:
                marks.append((block, 0))
            for mark, off in marks:
                end = ends.get(mark)
                if end is not None and end[0] != rid:
                    return end[3], i + 1, self._reach(request, end, start, off), end[0]
            if past.count == 1 and past.last != rid:  # a lone end (``docs/dev/default.md``)
                return past.worker, i + 1, start, past.last
        return None

    def _reach(self, request: RequestFeatures, end: _End, start: int, off: int) -> int:
        """Characters of ``request`` the ``end``'s request (past ``B``, at ``start``) left
        cached: its mark's ``off`` past ``B``, or to its reply's end if the texts agree to
        its exact end (module docs)."""
        block, rest, exact, reply = end[1], end[4], end[5], end[6]
        if rest < 0 or start + rest > request.prompt_chars:
            return start + off
        if rest and span_hashes(request.prompt_pieces, start, (rest,), block)[0] != exact:
            return start + off
        reach = start + rest + reply
        return reach if reach < request.prompt_chars else request.prompt_chars

    def replied(self, request: RequestFeatures, chars: int) -> None:
        """``request``'s reply was ``chars`` long: a later turn through its end re-sends it."""
        found = self._end_of(request) if chars > 0 else None
        if found is None:
            return
        mark = found[0]
        end = self._ends.get(mark)
        if end is not None and end[0] == request.request_id and end[4] >= 0:
            self._ends[mark] = (*end[:6], chars)

    def note(self, request: RequestFeatures, worker: WorkerId) -> None:
        """Remember where ``request``, routed to ``worker``, ended (see the module docs)."""
        found = self._end_of(request)
        if found is None:
            return
        mark, full, off, rest, exact = found
        block, rid = request.prefix_hashes[full - 1], request.request_id
        self._mark(mark, (rid, block, off, worker, rest, exact, 0))

    def _end_of(self, request: RequestFeatures) -> _Where | None:
        """Where ``request`` ends: its mark, its whole blocks (``B`` the last), ``off``, and
        its exact end, the characters past ``B`` (-1: not known) and their hash."""
        hashes = request.prefix_hashes
        full = self._full_blocks(request)
        if full <= 0:
            return None
        block = hashes[full - 1]
        start, off, rest = self._depth_chars(full), 0, 0
        pieces = request.prompt_pieces
        if pieces and full < len(hashes):  # a partial block follows ``B``
            rest = min(request.prompt_chars, self._depth_chars(full + 1)) - start
            off = rest // self._fine * self._fine
        spans = span_hashes(pieces, start, (off, rest), block) if rest else [block, block]
        if not pieces or start + rest != request.prompt_chars:
            rest = -1  # no text, or the chain stops short of the prompt's end
        return spans[0] if off else block, full, off, rest, spans[1]

    def _mark(self, mark: BlockHash, end: _End) -> None:
        """Note ``end`` at ``mark`` (the newest), forgetting the oldest past ``capacity``."""
        rid, block, off, worker = end[:4]
        ends, blocks = self._ends, self._past
        past = blocks.get(block)
        if past is None:
            past = blocks[block] = _Past()
        if ends.pop(mark, None) is None:
            past.count += 1
            past.offsets[off] = past.offsets.get(off, 0) + 1
        past.last, past.worker = rid, worker
        ends[mark] = end
        if len(ends) > self._capacity:
            _, (_, old, old_off, *_) = ends.popitem(last=False)
            self._unmark(old, old_off)

    def _unmark(self, block: BlockHash, off: int) -> None:
        """One end past ``block`` (at ``off``) is gone."""
        past = self._past[block]
        past.count -= 1
        at = past.offsets
        at[off] -= 1
        if not at[off]:
            del at[off]
        if not past.count:
            del self._past[block]
