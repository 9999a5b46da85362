"""The prefix blocks requests in flight hold on each worker, counted (``RunningBlocks``).

An engine allocates KV for a request's blocks unless a running request already
uses them: a tool preamble every agent shares is held once, however many agents
run, while an agent's own earlier turns (cached, but freed when that turn ended)
take KV again. What a new request adds to a worker's KV in use is therefore its
prompt less the leading blocks the requests in flight there share with it, not
less everything the worker has cached.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence

from kvgate.types import BlockHash, WorkerId


class RunningBlocks:
    """Per worker, how many requests in flight hold each prefix block; by request id
    (``fly``, ``landed``), at most ``limit`` requests."""

    __slots__ = ("_counts", "_firsts", "_flying", "limit")

    def __init__(self, limit: int = 65_536) -> None:
        self._counts: dict[WorkerId, dict[BlockHash, int]] = {}
        # A chain's first block -> per worker, the requests in flight there it opens: a
        # chained hash is its block's only at the chain's start, so these are the workers
        # whose requests share a block with a chain at all (``shared_depths``).
        self._firsts: dict[BlockHash, dict[WorkerId, int]] = {}
        self._flying: dict[str, tuple[WorkerId, Sequence[BlockHash]]] = {}
        self.limit = limit

    def fly(self, request_id: str, worker: WorkerId, hashes: Sequence[BlockHash]) -> None:
        """Request ``request_id`` with chain ``hashes`` is in flight on ``worker`` (no more
        where it was routed before)."""
        self.landed(request_id)
        if len(self._flying) < self.limit:
            self._flying[request_id] = (worker, hashes)
            self.add(worker, hashes)

    def landed(self, request_id: str) -> None:
        """Request ``request_id`` ended or was dropped (``fly``)."""
        flying = self._flying.pop(request_id, None)
        if flying is not None:
            self.remove(*flying)

    def add(self, worker: WorkerId, hashes: Sequence[BlockHash]) -> None:
        """A request with chain ``hashes`` started on ``worker``."""
        counts = self._counts.get(worker)
        if counts is None:
            counts = self._counts[worker] = {}
        get = counts.get
        for h in hashes:
            counts[h] = get(h, 0) + 1
        if hashes:
            on = self._firsts.get(hashes[0])
            if on is None:
                on = self._firsts[hashes[0]] = {}
            on[worker] = on.get(worker, 0) + 1

    def remove(self, worker: WorkerId, hashes: Sequence[BlockHash]) -> None:
        """A request with chain ``hashes`` on ``worker`` ended."""
        counts = self._counts.get(worker)
        if counts is None:
            return
        for h in hashes:
            left = counts.get(h, 0) - 1
            if left > 0:
                counts[h] = left
            else:
                counts.pop(h, None)
        on = self._firsts.get(hashes[0]) if hashes else None
        if on is not None and worker in on:
            left = on[worker] - 1
            if left > 0:
                on[worker] = left
            else:
                del on[worker]
                if not on:
                    del self._firsts[hashes[0]]

    def shared_depth(self, worker: WorkerId, hashes: Sequence[BlockHash]) -> int:
        """Leading blocks of ``hashes`` some request in flight on ``worker`` holds."""
        counts = self._counts.get(worker)
        if not counts:
            return 0
        depth = 0
        for h in hashes:
            if h not in counts:
                break
            depth += 1
        return depth

    def shared_depths(
        self, hashes: Sequence[BlockHash], among: Container[WorkerId]
    ) -> Iterator[tuple[WorkerId, int]]:
        """``shared_depth`` for each worker of ``among`` some request in flight on which
        shares a block with ``hashes`` (workers sharing none are left out), in the order
        the workers started requests: one look-up for the chain's first block, then a
        walk on each worker running a request it opens (none on an idle fleet)."""
        if not hashes:
            return
        on = self._firsts.get(hashes[0])
        if not on:
            return
        every = self._counts
        for worker in on if len(on) == 1 else [w for w in every if w in on]:
            if worker in among:
                counts = every[worker]
                depth = 1
                for h in hashes[1:]:
                    if h not in counts:
                        break
                    depth += 1
                yield worker, depth

    def forget(self, worker: WorkerId) -> None:
        """Drop what ``worker`` holds (it left the fleet)."""
        self._counts.pop(worker, None)
        for first, on in list(self._firsts.items()):
            if on.pop(worker, None) is not None and not on:
                del self._firsts[first]
