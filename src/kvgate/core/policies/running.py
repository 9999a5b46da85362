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

    __slots__ = ("_counts", "_flying", "limit")

    def __init__(self, limit: int = 65_536) -> None:
        self._counts: dict[WorkerId, dict[BlockHash, int]] = {}
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
        shares a block with ``hashes`` (workers sharing none are left out): one look
        at the first block a busy worker, none an idle one."""
        if not hashes:
            return
        first = hashes[0]
        for worker, counts in self._counts.items():
            if first in counts and worker in among:
                depth = 1
                for h in hashes[1:]:
                    if h not in counts:
                        break
                    depth += 1
                yield worker, depth

    def forget(self, worker: WorkerId) -> None:
        """Drop what ``worker`` holds (it left the fleet)."""
        self._counts.pop(worker, None)
