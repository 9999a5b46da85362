"""Sessions away on a tool call, in virtual time: the reservation and the offload.

The simulator's side of ``core.toolcalls``, as the live gateway's: a turn that ends in a
tool call books its session away on its worker (the KV its prompt and answer hold); a
worker's ``kv_reserved_tokens`` is the KV of its sessions away and expected back, which
the policy counts in the eviction cost of placing other work there. A worker with a CPU
tier (``SimConfig.cpu_offload_blocks``) has its away sessions' KV copied there
(``Engine.offload(copy=True)``, ``core.toolcalls.OFFLOAD_AT``), from where their return
restores it, if the GPU's copy was evicted meanwhile, instead of recomputing it; a worker
without one keeps it (an offload would drop it). Runs only where the gateway handles memory
pressure (``SimConfig.pressure``): a peer router does none of it.
"""

from __future__ import annotations

from dataclasses import replace

from kvgate.core.toolcalls import AwaySessions
from kvgate.sim.worker import SimWorker
from kvgate.types import Seconds, SessionKey


class SimToolCalls:
    """The away book of one simulated gateway, applied to its workers."""

    def __init__(self, workers: list[SimWorker], offload_at: float) -> None:
        self.workers = workers
        self.offload_at = offload_at
        """KV usage at which a worker's away sessions are offloaded (``OFFLOAD_AT``)."""
        self.book = AwaySessions()
        self.offloads = 0

    def returned(self, key: SessionKey | None, now: Seconds) -> None:
        """A request of ``key`` arrived: if it was away, it is back."""
        if key is not None and self.book.returned(key, now) is not None:
            self._reserve(now)

    def left(self, key: SessionKey, worker: SimWorker, kv_tokens: int, now: Seconds) -> None:
        """``key``'s turn on ``worker`` ended in a tool call."""
        self.book.left(key, worker.id, kv_tokens, now)
        if not worker.engine.config.cpu_offload_blocks:
            self._reserve(now)
            return  # nowhere to keep it: an offload would drop it
        due = self.book.offload_due(worker.id, worker.engine.kv_usage, self.offload_at)
        if due:
            worker.engine.offload(session_ids=due, now=now, copy=True)
            self.offloads += len(due)
        self._reserve(now)

    def _reserve(self, now: Seconds) -> None:
        self.book.expire(now)
        reserved = self.book.reserved(now)
        for worker in self.workers:
            tokens = reserved.get(worker.id, 0)
            if worker.routed.kv_reserved_tokens != tokens:
                worker.update(replace(worker.routed, kv_reserved_tokens=tokens))
