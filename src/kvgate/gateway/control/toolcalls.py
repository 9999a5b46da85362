"""Sessions away on a tool call, live: the reservation on their workers, and the offload.

The request path tells this plane two things: a session's request arrived
(``returned``: if it was away, it is back, and its pause teaches ``core.toolcalls.
ToolPauses``), and an attempt ended (``ended``, an end listener of the router's attempts:
if its answer ended in a tool call, ``finish_reason: tool_calls`` or ``stop_reason:
tool_use``, and the client has it, ``core.toolcalls.leaves_away``, its session is away).
Both data planes (the proxy and the endpoint picker) report the first; the attempt's one
end, on whichever path it ends, reports the second. While a session is away
its worker's ``Routed.kv_reserved_tokens`` carries its KV, so the policy counts it in
the eviction cost of placing other work there. On a worker with a lossless tier
(``lossless``: a llama.cpp worker under slot offload, whose slot is saved to disk; a
worker with an explicit ``offload_url``, whose operator says it keeps offloaded KV) the
session's KV is offloaded (``PressureDriver.offload_sessions``, ``core.toolcalls.
OFFLOAD_AT``: a copy the emulated worker keeps beside the GPU's) and restored when it
returns, if evicted meanwhile, instead of recomputed; elsewhere an offload would drop it,
so it stays. The decisions are
``core.toolcalls.AwaySessions``'s; this plane only carries them out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from kvgate.core.attempt import AttemptEnd
from kvgate.core.features import RequestFeatures
from kvgate.core.toolcalls import OFFLOAD_AT, AwaySessions, leaves_away
from kvgate.gateway.observe.metrics import ToolCallReading
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.types import SessionKey

log = logging.getLogger("kvgate.gateway.control.toolcalls")

Offload = Callable[[Worker, list[SessionKey], str], Coroutine[Any, Any, bool]]
"""Asks a worker to offload sessions' KV (worker, session keys, reason); True if done."""


class ToolCallPlane:
    """The sessions away on a tool call, applied to the pool's workers."""

    def __init__(
        self,
        pool: WorkerPool,
        *,
        offload: Offload | None,
        offload_at: float = OFFLOAD_AT,
        lossless: Callable[[Worker], bool] = lambda worker: False,
        book: AwaySessions | None = None,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.offload = offload
        self.offload_at = offload_at
        """KV usage at which a worker's away sessions are offloaded (``OFFLOAD_AT``)."""
        self.lossless = lossless
        """Whether a worker keeps KV it is asked to offload (else it would drop it)."""
        self.book = book if book is not None else AwaySessions()
        self.mono = mono
        self.tool_calls = 0
        """Answers seen ending in a tool call."""
        self.bookings = 0
        """Sessions booked away (answers with a session key ending in a tool call)."""
        self.returns = 0
        """Sessions back from a tool call while booked."""
        self._tasks: set[asyncio.Task[bool]] = set()

    def returned(self, key: SessionKey | None) -> None:
        """A request of session ``key`` arrived: if it was away, it is back."""
        if key is not None and self.book.returned(key, self.mono()) is not None:
            self.returns += 1
            self._reserve()

    def ended(self, features: RequestFeatures, end: AttemptEnd) -> None:
        """An attempt ended (``EndListener``): book its session away if it left to run a tool."""
        if not end.tool_call:
            return
        kv_tokens = leaves_away(end)
        worker = self.pool.get(end.worker)
        if kv_tokens is not None and worker is not None:
            self.left(features.session_key, worker, kv_tokens)

    def left(self, key: SessionKey | None, worker: Worker, kv_tokens: int) -> None:
        """Session ``key``'s answer on ``worker`` ended in a tool call, its KV there."""
        self.tool_calls += 1
        if key is None:
            return  # a headerless agent: its next turn is found by its chain
        self.book.left(key, worker.id, kv_tokens, self.mono())
        self.bookings += 1
        if self.offload is None or not self.lossless(worker):
            self._reserve()
            return
        signals = worker.routed.signals
        usage = signals.kv_usage if signals is not None else None
        due = self.book.offload_due(worker.id, usage, self.offload_at)
        if due and self.offload is not None:
            task = asyncio.get_running_loop().create_task(self.offload(worker, due, "tool_call"))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._reserve()

    def reading(self) -> ToolCallReading:
        """What ``/metrics`` shows of the plane (``GatewayMetrics.watch_tool_calls``)."""
        book = self.book
        return ToolCallReading(
            away=len(book),
            tool_calls=self.tool_calls,
            bookings=self.bookings,
            returns=self.returns,
            horizon_s=book.pauses.horizon(),
        )

    def _reserve(self) -> None:
        """Each worker's ``kv_reserved_tokens``, from the book (changed ones replaced)."""
        now = self.mono()
        self.book.expire(now)
        reserved = self.book.reserved(now)
        for worker in self.pool:
            tokens = reserved.get(worker.id, 0)
            if worker.routed.kv_reserved_tokens != tokens:
                worker.update(kv_reserved_tokens=tokens)

    async def stop(self) -> None:
        """Wait for the offloads asked (they are short calls with their own timeout)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
