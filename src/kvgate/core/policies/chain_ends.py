"""``ChainEnds``: where recent headerless requests ended, to tell a later turn from an opening.

A headerless request *extends* a conversation when its chain runs through a *chain
end*: where a headerless request routed before (another one: a retry of this request
does not count) ended. A later turn carries the earlier turn's whole prompt and goes
on from there; a chain that shares only an opening with others (a system prompt, a
tool preamble) runs through no earlier end, and *opens* one.

A request ends at its last whole block (a trailing partial block is hashed as it is,
so a later turn matches it only up to there). Past the fine blocks it ends at the last
whole fine block of the chain's tail (``RequestFeatures.tail_hashes``, ``core.chain``),
since a 4 KiB coarse block hides where in it a prompt ends.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kvgate.core.features import RequestFeatures
from kvgate.types import BlockHash


class ChainEnds:
    """The ends of the last ``capacity`` headerless requests routed, oldest first."""

    __slots__ = ("_capacity", "_depth_chars", "_ends")

    def __init__(self, capacity: int, depth_chars: Callable[[int], int]) -> None:
        self._capacity = capacity
        self._depth_chars = depth_chars
        """Characters the first ``n`` blocks of a chain cover (``PrefixIndex.depth_chars``)."""
        self._ends: OrderedDict[BlockHash, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ends)

    def _full_blocks(self, request: RequestFeatures) -> int:
        """Blocks of the request's chain that are whole (a trailing partial one is not)."""
        n = len(request.prefix_hashes)
        return n if self._depth_chars(n) <= request.prompt_chars else n - 1

    def opens(self, request: RequestFeatures) -> bool:
        """Whether ``request`` runs through no earlier request's end (see the module docs)."""
        ends = self._ends
        if not ends:
            return True
        rid = request.request_id
        for h in reversed(request.tail_hashes):
            owner = ends.get(h)
            if owner is not None and owner != rid:
                return False
        hashes = request.prefix_hashes
        for i in range(self._full_blocks(request) - 1, -1, -1):
            owner = ends.get(hashes[i])
            if owner is not None and owner != rid:
                return False
        return True

    def note(self, request: RequestFeatures) -> None:
        """Remember where the routed ``request`` ended (its last whole fine block)."""
        if request.tail_hashes:
            end = request.tail_hashes[-1]
        else:
            full = self._full_blocks(request)
            if full <= 0:
                return
            end = request.prefix_hashes[full - 1]
        ends = self._ends
        ends.pop(end, None)
        ends[end] = request.request_id
        if len(ends) > self._capacity:
            ends.popitem(last=False)
