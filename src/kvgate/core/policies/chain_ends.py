"""``ChainEnds``: where recent headerless requests ended, to tell a later turn from an opening.

A headerless request *extends* a conversation when its chain runs through a *chain
end*: where a headerless request routed before (another one: a retry of this request
does not count) ended. A later turn carries the earlier turn's whole prompt and goes
on from there; a chain that shares only an opening with others (a system prompt, a
tool preamble) runs through no earlier end, and *opens* one.

An end is marked exactly, whatever block it falls in: the chain's last whole block
``B``, the characters past it rounded down to a fine block (``off``: 0 within the fine
blocks, under a coarse block's width past them) and the hash of those characters
seeded with ``B`` (``core.chain.span_hashes``; ``B`` itself when ``off`` is 0). A later
request runs through the end when one of its whole blocks is ``B`` and its own text
for ``off`` characters from there hashes the same: however much it adds. The check
is lazy: only at a block that has marks is any text hashed, once per distinct ``off``
there (at most ``coarse_factor``). A request without its text (``block_mode: tokens``)
is marked at its last whole block alone (``off`` 0).

A *lone end* is a block past which one request alone ended: running through it
extends that request, whatever text follows. A trace of prompt blocks replays a
conversation's next turn without the earlier turn's last, partial block (its text
is the block's, and the block grew), so the later turn stops agreeing a little
before the earlier one's exact end, though it runs through its last whole block.
Strangers behind shared text ending at a block boundary part there, so once two
have ended past it only exact marks count: the first stranger after one
conversation reads as its next turn, the ones after read right.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kvgate.core.chain import span_hashes
from kvgate.core.features import RequestFeatures
from kvgate.types import BlockHash, WorkerId

_End = tuple[str, BlockHash, int, WorkerId]
"""What a mark stands for: the request that ended there, its block ``B``, ``off`` and
the worker the request was routed to."""

Through = tuple[WorkerId, int, int, str]
"""The end a request runs through: the worker the earlier request went to, the whole
blocks of the chain up to ``B``, the characters the end covers (``B``'s and ``off``)
and the earlier request's id."""


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
            if past.count == 1 and past.last != rid:
                return past.worker, i + 1, start, past.last  # a lone end (see the module docs)
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
                    return end[3], i + 1, start + off, end[0]
        return None

    def note(self, request: RequestFeatures, worker: WorkerId) -> None:
        """Remember where ``request``, routed to ``worker``, ended (see the module docs)."""
        full = self._full_blocks(request)
        if full <= 0:
            return
        block = request.prefix_hashes[full - 1]
        start, off = self._depth_chars(full), 0
        pieces = request.prompt_pieces
        if pieces and full < len(request.prefix_hashes):  # a partial block follows ``B``
            end = min(request.prompt_chars, self._depth_chars(full + 1))
            off = (end - start) // self._fine * self._fine
        mark = span_hashes(pieces, start, (off,), block)[0] if off else block
        ends, blocks = self._ends, self._past
        past = blocks.get(block)
        if past is None:
            past = blocks[block] = _Past()
        if ends.pop(mark, None) is None:
            past.count += 1
            past.offsets[off] = past.offsets.get(off, 0) + 1
        past.last, past.worker = request.request_id, worker
        ends[mark] = (request.request_id, block, off, worker)
        if len(ends) > self._capacity:
            _, (_, old, old_off, _) = ends.popitem(last=False)
            past = blocks[old]
            past.count -= 1
            at = past.offsets
            at[old_off] -= 1
            if not at[old_off]:
                del at[old_off]
            if not past.count:
                del blocks[old]
