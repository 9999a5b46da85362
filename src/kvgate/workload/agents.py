"""Agents that call tools: a shared tool preamble, 10-40 turns, heavy-tailed pauses, subagents.

What agent traffic looks like to a router (issue 49): every session opens with the same
long tool preamble (the system prompt and tool definitions its CLI sends), then its own
task, then loops: each turn ends calling a tool (``tool_call``), the tool runs for a
while, and the next turn (``returning``) re-sends everything with the tool's result and
the earlier answer appended. Tool pauses are heavy-tailed (log-normal: most take
seconds, a few take minutes: builds, test suites, a human approving a command), so a
session's KV sits idle on its worker for a long and unpredictable time. Now and then a
turn spawns a **subagent**: a session of its own that opens with the same preamble and
the parent's task, then its own subtask, and names its parent (``parent_session``, sent
as ``X-Dynamo-Parent-Session-ID``). Sessions send their id (agent CLIs do, in their own
headers). Example: ``--workload agent-tools:rate=4,pause_median_s=8``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from kvgate.types import Seconds
from kvgate.workload.arrivals import ArrivalSpec, RatedArrivals
from kvgate.workload.request import Segment, SimRequest
from kvgate.workload.streams import Ids, around


@dataclass(frozen=True, slots=True)
class AgentToolsConfig(RatedArrivals):
    """Tool-calling agents (see the module docs); ``rate`` is requests per second."""

    rate: float = 6.0
    arrival: str = "poisson"
    preamble_tokens: int = 4096
    task_tokens: int = 600
    turns_min: int = 10
    turns_max: int = 40
    result_tokens: int = 350
    output_tokens: int = 120
    pause_median_s: float = 4.0
    pause_sigma: float = 1.4
    pause_max_s: float = 300.0
    subagent_p: float = 0.04
    subagent_turns_min: int = 3
    subagent_turns_max: int = 8
    subtask_tokens: int = 300

    def stream(self, name: str, seed: int, arrival: ArrivalSpec) -> Iterator[SimRequest]:
        """The request stream (see the module docs)."""
        return _agents(name, seed, arrival, self)


@dataclass(order=True)
class _Agent:
    at: Seconds
    order: int
    key: str = field(compare=False)
    context: list[Segment] = field(compare=False)
    turns_left: int = field(compare=False)
    parent: str | None = field(compare=False, default=None)
    turn: int = field(compare=False, default=0)
    opening: int = field(compare=False, default=2)


def _agents(
    name: str, seed: int, arrival: ArrivalSpec, c: AgentToolsConfig
) -> Iterator[SimRequest]:
    rng = random.Random(f"{name}:{seed}")
    ids = Ids(1)  # id 0 is the shared tool preamble
    mean_turns = (c.turns_min + c.turns_max) / 2.0
    starts = arrival.times(random.Random(f"{name}:{seed}:arrivals"), arrival.rate / mean_turns)
    order = itertools.count()
    sessions = itertools.count()
    pending: list[_Agent] = []
    mu = math.log(max(1e-3, c.pause_median_s))

    def pause() -> Seconds:
        return min(c.pause_max_s, rng.lognormvariate(mu, c.pause_sigma))

    def spawn(at: Seconds, head: list[Segment], lo: int, hi: int, parent: str | None) -> None:
        key = f"a{next(sessions)}"
        turns = rng.randint(max(1, lo), max(1, lo, hi))
        agent = _Agent(at, next(order), key, list(head), turns, parent, opening=len(head))
        heapq.heappush(pending, agent)

    next_start = next(starts)
    n = 0
    while True:
        if pending and pending[0].at <= next_start:
            agent = heapq.heappop(pending)
            if agent.turn > 0:
                agent.context.append((ids.take(), around(rng, c.result_tokens)))
            agent.turn += 1
            agent.turns_left -= 1
            max_tokens = around(rng, c.output_tokens)
            more = agent.turns_left > 0
            reply = (ids.take(), max_tokens) if more else None
            yield SimRequest.of(
                arrival=agent.at,
                request_id=f"r{n}",
                segments=tuple(agent.context),
                max_tokens=max_tokens,
                session_id=agent.key,
                opening=agent.opening,  # the preamble (system), the task (and subtask)
                reply=reply,
                conversation=agent.key,
                tool_call=more,
                returning=agent.turn > 1,
                parent_session=agent.parent,
            )
            n += 1
            if reply is None:
                continue
            agent.context.append(reply)
            if agent.parent is None and rng.random() < c.subagent_p:
                # The subagent opens with the parent's preamble and task, then its own.
                subtask = (ids.take(), around(rng, c.subtask_tokens))
                head = [*agent.context[:2], subtask]
                spawn(agent.at, head, c.subagent_turns_min, c.subagent_turns_max, agent.key)
            agent.at += pause()
            heapq.heappush(pending, agent)
        else:
            task: Segment = (ids.take(), around(rng, c.task_tokens))
            spawn(next_start, [(0, c.preamble_tokens), task], c.turns_min, c.turns_max, None)
            next_start = next(starts)
