"""Doubly linked lists threaded through two int arrays, addressed by slot number.

A Python object per list node would cost ~100 bytes; two ``array('i')`` cells cost
8. ``SessionTable`` keeps three families of these lists (recency, per worker, per
expiry bucket) over the same slots, which is what keeps a million sessions small.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

NIL = -1
"""The slot number that means "no slot" (end of a list)."""


class Links:
    """Many disjoint lists over one slot space; each list is named by an int id.

    A slot belongs to at most one list of a given ``Links`` at a time. Pushing
    appends at the tail, so a list iterates oldest-pushed first.
    """

    __slots__ = ("_heads", "_tails", "next", "prev")

    def __init__(self) -> None:
        self.prev = array("i")
        self.next = array("i")
        self._heads: dict[int, int] = {}
        self._tails: dict[int, int] = {}

    def grow(self) -> None:
        """Make room for one more slot (the table's slot space grew by one)."""
        self.prev.append(NIL)
        self.next.append(NIL)

    def push(self, list_id: int, slot: int) -> None:
        """Append ``slot`` at the tail of list ``list_id`` (created if needed)."""
        tail = self._tails.get(list_id, NIL)
        self.prev[slot] = tail
        self.next[slot] = NIL
        if tail == NIL:
            self._heads[list_id] = slot
        else:
            self.next[tail] = slot
        self._tails[list_id] = slot

    def remove(self, list_id: int, slot: int) -> None:
        """Unlink ``slot`` from list ``list_id``; an emptied list ceases to exist."""
        before = self.prev[slot]
        after = self.next[slot]
        if before == NIL:
            if after == NIL:
                del self._heads[list_id]
                del self._tails[list_id]
                return
            self._heads[list_id] = after
        else:
            self.next[before] = after
        if after == NIL:
            self._tails[list_id] = before
        else:
            self.prev[after] = before

    def move_to_tail(self, list_id: int, slot: int) -> None:
        """Make ``slot`` the most recent member of list ``list_id``."""
        if self._tails.get(list_id, NIL) != slot:
            self.remove(list_id, slot)
            self.push(list_id, slot)

    def head(self, list_id: int) -> int:
        """The oldest slot in list ``list_id``, or ``NIL``."""
        return self._heads.get(list_id, NIL)

    def __contains__(self, list_id: int) -> bool:
        return list_id in self._heads

    def slots(self, list_id: int) -> Iterator[int]:
        """The slots of list ``list_id``, oldest first (do not mutate while iterating)."""
        slot = self._heads.get(list_id, NIL)
        nxt = self.next
        while slot != NIL:
            yield slot
            slot = nxt[slot]

    def clear(self) -> None:
        """Forget every list and every slot."""
        self.prev = array("i")
        self.next = array("i")
        self._heads.clear()
        self._tails.clear()
