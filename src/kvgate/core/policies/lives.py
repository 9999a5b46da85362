"""What a conversation brings to the worker it opens on, over its whole life.

A placement that opens a conversation decides where all of it goes: its later turns
follow its cache (a session its binding, a headerless conversation its own chain). So what
it will put in that cache, and evict there, is not this turn's uncached tokens but the
conversation's whole life's: ``Lives.tokens()``, measured as the uncached tokens routed
over the conversations opened (both counts halved every ``half_life`` requests).

A request with a session id opens one where it has no binding yet. A headerless one opens
one unless it runs through the end of one earlier headerless request (a later turn re-sends
its earlier turn's prompt). An end is marked past the chain's last whole block ``B``: the
hash of the text from ``B`` to the prompt's end (rounded down to a fine block), seeded
with ``B``'s hash (``core.chain.span_hashes``), so an end inside a coarse block (1,024
tokens past the first 16 KiB) is still told apart. A mark two requests made is text
strangers share (a preamble ending at a block): running through it says nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kvgate.core.chain import span_hashes
from kvgate.core.features import RequestFeatures
from kvgate.types import BlockHash, WorkerId


class Lives:
    """Whether a request opens a conversation, and the tokens a conversation brings."""

    def __init__(
        self, depth_chars: Callable[[int], int], max_ends: int = 65_536, half_life: float = 2_000.0
    ) -> None:
        self._depth_chars = depth_chars  # characters the first n blocks of a chain cover
        self._fine = depth_chars(1)
        # mark -> (requests that ended there, the last one's worker and characters);
        # block B -> the offsets of marks past it.
        self._ends: OrderedDict[BlockHash, tuple[int, WorkerId, int]] = OrderedDict()
        self._past: dict[BlockHash, set[int]] = {}
        self._max_ends = max_ends
        self._decay = 0.5 ** (1.0 / half_life)
        self._tokens = 0.0
        self._opened = 0.0

    def opens(self, request: RequestFeatures, bound: bool) -> bool:
        """Whether ``request`` opens a conversation (``bound``: its session has a binding)."""
        if request.session_key is not None:
            return not bound
        return self.through(request) is None

    def through(self, request: RequestFeatures) -> tuple[WorkerId, int] | None:
        """The end of an earlier request ``request`` runs through: the worker it went to and
        the characters of this prompt it sent there (``None``: none)."""
        ends, past, chars = self._ends, self._past, self._depth_chars
        prompt = request.prompt_chars
        for depth, block in enumerate(request.prefix_hashes, 1):
            offsets = past.get(block)
            if offsets is None:
                continue
            start = chars(depth)
            lengths = [off for off in offsets if 0 < off <= prompt - start]
            marks = [(block, 0)] if 0 in offsets else []
            if lengths and request.prompt_pieces:
                hashed = span_hashes(request.prompt_pieces, start, lengths, block)
                marks += zip(hashed, lengths, strict=True)
            for mark, off in marks:
                end = ends.get(mark)
                if end is not None and end[0] == 1:
                    return end[1], start + off
        return None

    def routed(
        self, request: RequestFeatures, worker: WorkerId, uncached_tokens: float, opened: bool
    ) -> None:
        """``request`` was sent to ``worker`` with ``uncached_tokens`` to compute; it
        ``opened`` a conversation or not."""
        decay = self._decay
        self._tokens = self._tokens * decay + uncached_tokens
        self._opened = self._opened * decay + (1.0 if opened else 0.0)
        if request.session_key is None and request.prefix_hashes:
            self._mark(request, worker)

    def _mark(self, request: RequestFeatures, worker: WorkerId) -> None:
        """Mark where ``request`` ends: past its last whole block (module docs)."""
        hashes, prompt, chars = request.prefix_hashes, request.prompt_chars, self._depth_chars
        whole = len(hashes) if chars(len(hashes)) <= prompt else len(hashes) - 1
        if whole <= 0:
            return
        block, start = hashes[whole - 1], chars(whole)
        off = (prompt - start) // self._fine * self._fine if request.prompt_pieces else 0
        mark = span_hashes(request.prompt_pieces, start, [off], block)[0] if off else block
        ends = self._ends
        count = ends[mark][0] if mark in ends else 0
        ends[mark] = (count + 1, worker, start + off)
        ends.move_to_end(mark)
        self._past.setdefault(block, set()).add(off)
        if len(ends) > self._max_ends:
            ends.popitem(last=False)  # its block's offsets stay: a look-up finds nothing

    def tokens(self) -> float:
        """Uncached tokens a conversation routes over its life, on average (0: none yet)."""
        return self._tokens / self._opened if self._opened > 0.0 else 0.0
