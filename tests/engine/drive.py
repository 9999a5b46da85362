"""A tiny discrete-event driver for engine tests: arrivals, aborts, steps in virtual time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvgate.engine import Engine, EngineRequest, FinishedRequest, StepResult
from kvgate.engine.blocks import chain_hashes


@dataclass(frozen=True)
class Arrival:
    """A request arriving at ``time``; aborted ``abort_after`` seconds later if still live."""

    time: float
    request: EngineRequest
    abort_after: float | None = None


@dataclass
class Outcome:
    """Everything a run produced, in a comparable form."""

    finished: dict[str, FinishedRequest] = field(default_factory=dict)
    aborted: set[str] = field(default_factory=set)
    first_tokens: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    steps: int = 0
    end: float = 0.0


def prompt_hashes(family: int, shared_tokens: int, unique: int, tokens: int, bs: int) -> list[int]:
    """Chain hashes of a prompt: ``shared_tokens`` common to ``family``, the rest unique."""
    ids = [family * 1_000_003 + i for i in range(shared_tokens)]
    ids += [unique * 7_919 + 10**9 + i for i in range(tokens - shared_tokens)]
    return chain_hashes(ids[:tokens], bs)


def run(
    engine: Engine,
    arrivals: Sequence[Arrival],
    horizon: float | None = None,
    check: Callable[[Engine, StepResult], None] | None = None,
    max_iterations: int = 200_000,
) -> Outcome:
    """Drive ``engine`` through ``arrivals`` until nothing is left; fail if it never ends."""
    out = Outcome()
    pending = sorted(arrivals, key=lambda a: a.time)
    aborts: list[tuple[float, str]] = []
    now = 0.0
    i = 0
    for _ in range(max_iterations):
        while i < len(pending) and pending[i].time <= now:
            arrival = pending[i]
            engine.submit(arrival.request, arrival.time)
            if arrival.abort_after is not None:
                aborts.append((arrival.time + arrival.abort_after, arrival.request.request_id))
            i += 1
        aborts.sort()
        while aborts and aborts[0][0] <= now:
            _, rid = aborts.pop(0)
            if engine.abort(rid, now):
                out.aborted.add(rid)
        upcoming = [a[0] for a in aborts[:1]]
        if i < len(pending):
            upcoming.append(pending[i].time)
        next_event = min(upcoming, default=None)
        if engine.has_work():
            h = horizon if next_event is None or horizon is None else min(horizon, next_event - now)
            result = engine.step(now, h)
            assert result.steps > 0, "an engine with work scheduled nothing"
            out.steps += result.steps
            for rid, cached in result.first_tokens:
                out.first_tokens[rid] = cached
            for rid, n in result.tokens.items():
                out.tokens[rid] = out.tokens.get(rid, 0) + n
            for fin in result.finished:
                out.finished[fin.request_id] = fin
            out.preempted.extend(result.preempted)
            if check is not None:
                check(engine, result)
            now += result.duration
        elif next_event is not None:
            now = max(now, next_event)
        else:
            out.end = now
            return out
    raise AssertionError("the run did not finish within max_iterations")
