"""The real-time driver: runs one ``Engine`` against the event loop's clock.

Model time is real elapsed time multiplied by ``time_scale``. One background task
loops: step the engine at the model clock's ``now``, wait until the step's model
duration has passed in real time, then hand the step's events to the queues of
the requests they belong to. With no work it sleeps on an ``asyncio.Event`` that
``submit`` sets. Steps never overlap in model time; waits shorter than a timer
tick are not slept, so events may arrive up to ``_MIN_SLEEP_S`` early, never late
by design.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from kvgate.engine import Engine, EngineRequest, StepResult
from kvgate.engine.records import FinishedRequest

logger = logging.getLogger(__name__)

_IDLE_RETRY_S = 0.01
"""Real seconds to wait when the engine has work but cannot make progress."""

_MIN_SLEEP_S = 0.001
"""Shortest real wait worth a timer; events may come this much early, never more."""


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The request's prefill finished; ``cached_tokens`` of its prompt were cached."""

    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Tokens:
    """``count`` new output tokens."""

    count: int


@dataclass(frozen=True, slots=True)
class Finished:
    """The request is done; ``info`` is the engine's record of it."""

    info: FinishedRequest


@dataclass(frozen=True, slots=True)
class Preempted:
    """The engine preempted the request; it resumes (recomputing) later."""


@dataclass(frozen=True, slots=True)
class EngineFailed:
    """The stepping task died; the request will never finish."""


Event = FirstToken | Tokens | Finished | Preempted | EngineFailed


class EngineUnavailableError(RuntimeError):
    """Raised by ``submit`` once the stepping task has died."""


class EngineDriver:
    """Drives one engine in real time and routes its events to per-request queues."""

    def __init__(self, engine: Engine, time_scale: float = 1.0, horizon_s: float = 0.0) -> None:
        self.engine = engine
        self.time_scale = time_scale
        # Fusing decode steps up to this many model seconds keeps wake-ups near
        # one per ``horizon_s / time_scale`` real seconds at large time scales.
        self._horizon = horizon_s * time_scale if horizon_s > 0 else None
        self._queues: dict[str, asyncio.Queue[Event]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._origin: float | None = None
        self.steps = 0
        self.aborts = 0
        self.failed = False

    # -- clock ---------------------------------------------------------------

    def now(self) -> float:
        """The model clock: real seconds since start, times ``time_scale``.

        Reads ``time.monotonic`` (asyncio's own loop clock) rather than
        ``loop.time()``: uvloop's is cached per iteration in whole milliseconds,
        which at 1000x would quantize model time to seconds.
        """
        if self._origin is None:
            self._origin = time.monotonic()
        return (time.monotonic() - self._origin) * self.time_scale

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        """Start the stepping task on the running loop."""
        if self._task is None:
            self.now()  # pin the clock's origin
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="workersim-engine"
            )

    async def stop(self) -> None:
        """Stop stepping; requests still waiting see no more events."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def running(self) -> bool:
        """True while the stepping task is alive."""
        return self._task is not None and not self._task.done()

    # -- requests ------------------------------------------------------------

    def submit(self, request: EngineRequest) -> asyncio.Queue[Event]:
        """Enqueue ``request`` in the engine; its events arrive on the returned queue."""
        if self.failed:
            raise EngineUnavailableError("the engine's stepping task has failed")
        self.engine.submit(request, self.now())
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._queues[request.request_id] = queue
        self._wake.set()
        return queue

    def abort(self, request_id: str) -> bool:
        """The client went away: free the request in the engine and drop its queue."""
        self._queues.pop(request_id, None)
        aborted = self.engine.abort(request_id, self.now())
        if aborted:
            self.aborts += 1
        self._wake.set()
        return aborted

    def release(self, request_id: str) -> None:
        """Forget a request that finished normally."""
        self._queues.pop(request_id, None)

    def wake(self) -> None:
        """Make the stepping task look at the engine again (state changed outside it)."""
        self._wake.set()

    @property
    def in_flight(self) -> int:
        """Requests with a live queue (submitted, not finished, not aborted)."""
        return len(self._queues)

    # -- the loop ------------------------------------------------------------

    async def _run(self) -> None:
        cursor = 0.0  # model time the last step ended: steps never overlap
        while True:
            if not self.engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            start = max(self.now(), cursor)
            try:
                result = self.engine.step(start, horizon=self._horizon)
            except Exception:
                # A model bug must not silently wedge every request: fail them all.
                logger.exception("engine step failed at t=%.6f", start)
                self.failed = True
                for queue in self._queues.values():
                    queue.put_nowait(EngineFailed())
                raise
            if result.steps == 0:
                # Work that cannot be scheduled yet: wait for a change or a moment.
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), _IDLE_RETRY_S)
                continue
            self.steps += 1
            cursor = start + result.duration
            lead = (cursor - self.now()) / self.time_scale
            # Event-loop timers are coarse (uvloop's tick is 1 ms): a shorter wait is
            # carried as a lead of the model clock instead, so a large time scale is
            # not capped at one step per tick.
            await asyncio.sleep(lead if lead >= _MIN_SLEEP_S else 0)
            self._deliver(result)

    def _deliver(self, result: StepResult) -> None:
        """Put each event on its request's queue."""
        queues = self._queues
        for request_id, cached in result.first_tokens:
            queue = queues.get(request_id)
            if queue is not None:
                queue.put_nowait(FirstToken(cached))
        for request_id, count in result.tokens.items():
            queue = queues.get(request_id)
            if queue is not None and count > 0:
                queue.put_nowait(Tokens(count))
        for preempted_id in result.preempted:
            queue = queues.get(preempted_id)
            if queue is not None:
                queue.put_nowait(Preempted())
        for finished in result.finished:
            queue = queues.get(finished.request_id)
            if queue is not None:
                queue.put_nowait(Finished(finished))
