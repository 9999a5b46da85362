"""Telling that a shared store lost its data (a ``FLUSHALL``, a restart without persistence).

Every replica keeps one key, the **epoch**, in the store: a token written with
``SET NX`` by whichever replica finds it missing. A replica remembers the epoch it
last saw; each check sets the key only if it is missing and reads what was there:

- missing: the data went (this replica writes the new epoch) — a loss;
- another token than the one remembered: another replica found it missing first
  and wrote a new one — the same loss, seen from here;
- the token remembered: nothing happened.

The first check only learns the epoch (or seeds it): what was lost before a replica
started is not its to report. Sessions bound before a loss are re-placed on their
next request like unknown ones; the loss itself is what an operator must see.
"""

from __future__ import annotations

import os


class Epoch:
    """What one replica knows of the store's epoch; ``observe`` says when data was lost."""

    __slots__ = ("known", "token")

    def __init__(self, token: str | None = None) -> None:
        self.token = token or os.urandom(8).hex()
        """What this replica writes when it finds the epoch missing."""
        self.known: str | None = None
        """The epoch last seen (``None`` before the first check)."""

    def observe(self, previous: str | None) -> bool:
        """The key's value before a ``SET epoch token NX GET`` (``None``: it was missing).

        Returns True when that shows the store lost its data since the last check.
        """
        current = previous if previous is not None else self.token
        lost = self.known is not None and current != self.known
        self.known = current
        if previous is None:
            # Our token is the epoch now: the next seed must differ from it.
            self.token = os.urandom(8).hex()
        return lost
