"""The real-time driver: runs one ``Engine`` against the event loop's clock.

Model time is real elapsed time multiplied by ``time_scale``. One background task
loops: step the engine, wait until the step's model end has come in real time,
then hand the step's events to the queues of the requests they belong to. With
no work it sleeps on an ``asyncio.Event`` that ``submit`` sets.

Model time runs on an absolute timeline, as the simulator's does: while the
engine is busy a step starts where the previous one ended, not when the loop got
round to it, and an idle engine starts at the arrival that woke it. Timer
overshoot and the loop's own overhead are then absorbed by the next waits
instead of adding up step after step, which at a large time scale would inflate
every latency by the overhead times the scale. So that a step never computes a
request before it came, ``submit`` stamps the request with the model clock and
the loop hands it to the engine at the first step starting at or after that
instant (and fuses decode steps no further). Events are never delivered before
their model time: model time never runs ahead of real time times the scale. If
the loop falls more than ``_MAX_LAG_S`` behind, the timeline jumps forward.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvgate.engine import Engine, EngineRequest, StepResult
from kvgate.engine.records import FinishedRequest
from kvgate.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

_IDLE_RETRY_S = 0.01
"""Real seconds to wait when the engine has work but cannot make progress."""

_TICK_S = 0.001
"""The event loop's timer resolution (uvloop's, and epoll's)."""

_MAX_LAG_S = 0.05
"""Real seconds the timeline may trail real time (an overloaded loop) before it jumps."""

_RECENT = 10_000
"""Finished requests ``EngineDriver.recent`` keeps (benchmarks read model-time latencies)."""


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
        # Submitted requests not yet in the engine, stamped with their arrival.
        self._arrivals: collections.deque[tuple[float, EngineRequest]] = collections.deque()
        self.recent: collections.deque[FinishedRequest] = collections.deque(maxlen=_RECENT)
        """The engine's records of the latest finished requests (model times), oldest first."""
        self.steps = 0
        self.aborts = 0
        self.lag_jumps = 0
        """Times the timeline jumped forward because the loop fell ``_MAX_LAG_S`` behind."""
        self.lag_lost_s = 0.0
        """Model seconds those jumps skipped: time in which the engine computed nothing
        because the process did not get the CPU, which inflates model-clock latencies."""
        self.failed = False
        self.on_step: Callable[[], None] | None = None
        """Called after every engine step (the KV event publisher drains the journal)."""

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
        await cancel_and_wait(task)

    @property
    def running(self) -> bool:
        """True while the stepping task is alive."""
        return self._task is not None and not self._task.done()

    # -- requests ------------------------------------------------------------

    def submit(self, request: EngineRequest) -> asyncio.Queue[Event]:
        """Enqueue ``request`` in the engine; its events arrive on the returned queue."""
        if self.failed:
            raise EngineUnavailableError("the engine's stepping task has failed")
        self._check(request)
        self._arrivals.append((self.now(), request))
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._queues[request.request_id] = queue
        self._wake.set()
        return queue

    def _check(self, request: EngineRequest) -> None:
        """Refuse now what ``Engine.submit`` would refuse when the request reaches it."""
        if request.request_id in self._queues:
            raise ValueError(f"request {request.request_id!r} is already in the engine")
        if request.prompt_tokens < 1 or request.max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be >= 1")
        if not self.engine.fits(request.prompt_tokens, request.max_tokens):
            raise ValueError(
                f"request {request.request_id!r} needs "
                f"{request.prompt_tokens + request.max_tokens} tokens of KV cache; "
                f"the engine holds {self.engine.config.kv_capacity_tokens}"
            )

    def abort(self, request_id: str) -> bool:
        """The client went away: free the request in the engine and drop its queue."""
        self._queues.pop(request_id, None)
        for i, (_, pending) in enumerate(self._arrivals):
            if pending.request_id == request_id:
                del self._arrivals[i]
                self.aborts += 1
                return True
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
        # Model time the last step ended, while the engine has been busy since.
        cursor: float | None = None
        floor = float("-inf")  # steps never overlap
        arrivals = self._arrivals
        engine = self.engine
        while True:
            if not arrivals and not engine.has_work():
                cursor = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self.now()
            if cursor is not None and engine.has_work():
                start = cursor
            else:  # an idle engine starts when the request that woke it came
                start = min(now, arrivals[0][0]) if arrivals else now
            start = max(start, floor)
            behind = now - _MAX_LAG_S * self.time_scale
            if start < behind:
                self.lag_lost_s += behind - start
                start = behind
                self.lag_jumps += 1
            horizon = self._horizon
            try:
                while arrivals and arrivals[0][0] <= start:
                    at, request = arrivals.popleft()
                    engine.submit(request, at)
                if arrivals:
                    # Nothing may be fused past the next arrival, as in the simulator.
                    gap = arrivals[0][0] - start
                    horizon = gap if horizon is None else min(horizon, gap)
                result = engine.step(start, horizon=horizon)
            except Exception:
                # A model bug must not silently wedge every request: fail them all.
                logger.exception("engine step failed at t=%.6f", start)
                self.failed = True
                for queue in self._queues.values():
                    queue.put_nowait(EngineFailed())
                raise
            if self.on_step is not None:
                self.on_step()
            if result.steps == 0:
                # Work that cannot be scheduled yet (or not arrived yet on the
                # timeline): wait for a change or a moment.
                cursor = None
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), _IDLE_RETRY_S)
                continue
            self.steps += 1
            cursor = floor = start + result.duration
            # A step whose end is already past (the loop is behind) only yields, so
            # I/O still runs between steps; the timeline catches up by itself.
            lead = (cursor - self.now()) / self.time_scale
            await asyncio.sleep(max(lead, 0.0))
            lead = (cursor - self.now()) / self.time_scale
            if lead > 0:
                # The timer fired early (uvloop rounds delays down to whole ticks):
                # wait one more tick rather than deliver before the step's end.
                await asyncio.sleep(lead + _TICK_S)
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
        self.recent.extend(result.finished)
        for finished in result.finished:
            queue = queues.get(finished.request_id)
            if queue is not None:
                queue.put_nowait(Finished(finished))
