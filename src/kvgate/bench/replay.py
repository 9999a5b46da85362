"""Live replay: a workload's requests sent at their arrival times, sessions in order.

Arrivals are honoured in real time (``arrival / time_scale`` seconds after the
start). A turn that re-sends an earlier turn's reply waits for that turn to
finish, so a session's requests never overlap and never leave before their
scheduled arrival: the next turn goes at ``max(arrival, previous finish)``.
The dependency is read from the prompt itself (the previous reply's segment
id), so it holds with or without session ids.

At most ``concurrency`` requests are in flight; a due request waiting for a
slot counts as client wait, not as latency.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvgate.bench.client import Answer, BenchClient
from kvgate.bench.payloads import PayloadBuilder
from kvgate.workload.request import SimRequest, previous_turn

ProgressFn = Callable[[int], None]
"""Called with the number of requests answered so far."""


@dataclass(slots=True)
class Outcome:
    """One replayed request: when it was due and sent, and what came back.

    Times are seconds since the replay started, in real (wall) time.
    """

    request_id: str
    session_id: str | None
    arrival: float
    """When the workload scheduled it."""
    due: float
    """When it could go: its arrival, or its session's previous turn's finish if later."""
    answer: Answer
    returning: bool = False
    """The request brings a tool's result back (an agent's later turn)."""
    prompt_tokens: int = 0
    """The workload's count of its prompt tokens (what an unanswered request missed)."""


class Replay:
    """Replays requests against one target through ``client``."""

    def __init__(
        self,
        client: BenchClient,
        builder: PayloadBuilder,
        *,
        time_scale: float = 1.0,
        progress: ProgressFn | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.client = client
        self.builder = builder
        self.time_scale = time_scale
        self._progress = progress
        self._slots = asyncio.Semaphore(client.concurrency)
        self._pending: dict[int, asyncio.Event] = {}
        self._replies: dict[int, str] = {}
        self._outcomes: list[Outcome] = []
        self._start = 0.0

    async def run(self, requests: Iterable[SimRequest]) -> list[Outcome]:
        """Send every request, wait for every answer; outcomes in arrival order."""
        loop = asyncio.get_running_loop()
        self._start = loop.time()
        tasks: list[asyncio.Task[Outcome]] = []
        try:
            await self._launch(requests, tasks)
            return list(await asyncio.gather(*tasks))
        finally:
            # Cancelled, or one request raised: stop the rest rather than leak them.
            for task in tasks:
                task.cancel()

    async def _launch(
        self, requests: Iterable[SimRequest], tasks: list[asyncio.Task[Outcome]]
    ) -> None:
        """Start one task per request at its arrival instant."""
        loop = asyncio.get_running_loop()
        for request in requests:
            delay = self._start + request.arrival / self.time_scale - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the workload's own clock, not a wait on a condition
            previous = self._previous_turn(request)
            turn: asyncio.Event | None = None
            if request.reply is not None:
                turn = asyncio.Event()
                self._pending[request.reply[0]] = turn
            tasks.append(asyncio.create_task(self._one(request, previous, turn)))

    def _previous_turn(self, request: SimRequest) -> asyncio.Event | None:
        """The unfinished turn whose reply this request re-sends, if any."""
        return previous_turn(request, self._pending)

    async def _one(
        self,
        request: SimRequest,
        previous: asyncio.Event | None,
        turn: asyncio.Event | None,
    ) -> Outcome:
        loop = asyncio.get_running_loop()
        try:
            if previous is not None:
                await previous.wait()
            due = loop.time() - self._start
            async with self._slots:
                payload = self.builder.payload(request, self._replies)
                answer = await self.client.send(payload)
            if request.reply is None:
                # The session's last turn: nothing will re-send its replies again.
                for seg_id, _ in request.segments:
                    self._replies.pop(seg_id, None)
            elif answer.ok:
                self._replies[request.reply[0]] = answer.text
        finally:
            if turn is not None:
                turn.set()
        outcome = Outcome(
            request.request_id,
            request.session_id,
            request.arrival / self.time_scale,
            due,
            _relative(answer, self._start),
            request.returning,
            request.prompt_tokens,
        )
        self._outcomes.append(outcome)
        if self._progress is not None:
            self._progress(len(self._outcomes))
        return outcome


def _relative(answer: Answer, start: float) -> Answer:
    """``answer`` with its instants made relative to ``start``."""
    answer.sent -= start
    answer.finished -= start
    if answer.first_token is not None:
        answer.first_token -= start
    return answer
