"""Synthetic workloads: chat, shared system prompts, RAG and agent loops.

Each workload is a config dataclass (defaults that mean something) and a
``requests()`` method returning a fresh, endless-or-bounded iterator of
``SimRequest`` in arrival order. Memory is bounded by the sessions active at one
instant, never by how many requests were produced. Rates are in requests per
second across the whole fleet; session workloads start sessions at
``rate / turns_mean`` so the request rate comes out right.

Arrivals are open-loop: a session's next turn comes one think time after the
previous turn's arrival, whatever the fleet did, as in trace replay.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Protocol

from kvgate.types import Seconds
from kvgate.workload.arrivals import ArrivalSpec
from kvgate.workload.request import Segment, SimRequest


class Workload(Protocol):
    """Anything that yields requests in arrival order (synthetic or a trace)."""

    @property
    def name(self) -> str:
        """The workload's or trace's short name."""
        ...

    def requests(self) -> Iterator[SimRequest]:
        """A fresh iterator over the workload's requests, from the beginning."""
        ...

    def describe(self) -> dict[str, Any]:
        """The workload's name and parameters, for reports."""
        ...


class ZipfSampler:
    """Draws ranks ``0..n-1`` with probability proportional to ``1 / (rank+1)**s``."""

    def __init__(self, n: int, s: float) -> None:
        if n <= 0:
            raise ValueError("a Zipf sampler needs at least one item")
        weights = [1.0 / (rank + 1) ** s for rank in range(n)]
        self._cumulative = list(itertools.accumulate(weights))
        self._total = self._cumulative[-1]

    def sample(self, rng: random.Random) -> int:
        """One rank."""
        return min(
            bisect.bisect_right(self._cumulative, rng.random() * self._total),
            len(self._cumulative) - 1,
        )

    def distinct(self, rng: random.Random, k: int) -> list[int]:
        """``k`` different ranks (fewer if there are fewer items), in draw order."""
        k = min(k, len(self._cumulative))
        picked: list[int] = []
        while len(picked) < k:
            rank = self.sample(rng)
            if rank not in picked:
                picked.append(rank)
        return picked


def _around(rng: random.Random, mean: int) -> int:
    """A positive size uniform on ``[mean/2, 3*mean/2]``: variety with a known mean."""
    if mean <= 1:
        return 1
    return max(1, rng.randint(mean // 2, mean + mean // 2))


def _turns(rng: random.Random, mean: float, cap: int) -> int:
    """A geometric number of turns (at least one) with the given mean, capped."""
    if mean <= 1:
        return 1
    p = 1.0 / mean
    n = 1
    while n < cap and rng.random() > p:
        n += 1
    return n


class _Ids:
    """Fresh segment ids; one counter per workload run so a seed fixes them all."""

    def __init__(self, reserved: int) -> None:
        self._next = reserved  # ids below are fixed content (system prompts, documents)

    def take(self, n: int = 1) -> int:
        first = self._next
        self._next += n
        return first


@dataclass(slots=True)
class _Session:
    key: str
    context: list[Segment]
    turns_left: int
    turn: int = 0


_TurnFn = Callable[[random.Random, _Ids, _Session], tuple[list[Segment], int]]
"""Builds one turn: the new segments appended to the context, and max_tokens."""


def _session_stream(
    name: str,
    seed: int,
    arrival: ArrivalSpec,
    *,
    turns_mean: float,
    think_s: Seconds,
    open_session: Callable[[random.Random, _Ids, str], _Session],
    next_turn: _TurnFn,
    session_ids: bool,
    reserved: int,
    opening: int,
) -> Iterator[SimRequest]:
    """Interleave sessions in time order: each turn re-sends the whole context."""
    rng = random.Random(f"{name}:{seed}")
    ids = _Ids(reserved)
    starts = arrival.times(random.Random(f"{name}:{seed}:arrivals"), arrival.rate / turns_mean)
    pending: list[tuple[Seconds, int, _Session]] = []
    order = itertools.count()
    next_start = next(starts)
    n_sessions = 0
    n_requests = 0
    while True:
        if pending and pending[0][0] <= next_start:
            at, _, session = heapq.heappop(pending)
            new, max_tokens = next_turn(rng, ids, session)
            session.context.extend(new)
            session.turn += 1
            session.turns_left -= 1
            # The reply becomes context of the next turn; its length is the
            # max_tokens the engine will generate.
            reply = (ids.take(), max_tokens) if session.turns_left > 0 else None
            yield SimRequest.of(
                arrival=at,
                request_id=f"r{n_requests}",
                segments=tuple(session.context),
                max_tokens=max_tokens,
                session_id=session.key if session_ids else None,
                opening=opening,
                reply=reply,
            )
            n_requests += 1
            if reply is not None:
                session.context.append(reply)
                gap = rng.expovariate(1.0 / think_s) if think_s > 0 else 0.0
                heapq.heappush(pending, (at + gap, next(order), session))
        else:
            session = open_session(rng, ids, f"s{n_sessions}")
            n_sessions += 1
            heapq.heappush(pending, (next_start, next(order), session))
            next_start = next(starts)


def _single_turn_stream(
    name: str,
    seed: int,
    arrival: ArrivalSpec,
    build: Callable[[random.Random, _Ids], tuple[list[Segment], int]],
    reserved: int,
) -> Iterator[SimRequest]:
    """Independent chat requests (system message, one user message) at arrival instants."""
    rng = random.Random(f"{name}:{seed}")
    ids = _Ids(reserved)
    for n, at in enumerate(arrival.times(random.Random(f"{name}:{seed}:arrivals"))):
        segments, max_tokens = build(rng, ids)
        yield SimRequest.of(at, f"r{n}", tuple(segments), max_tokens, opening=len(segments))


@dataclass(frozen=True, slots=True)
class ChatConfig:
    """Multi-turn chat: shared system prompts, sessions whose context grows.

    Each session uses one of ``system_prompts`` system prompts (uniformly) and,
    with ``doc_tokens`` > 0, opens with a document of its own (about that many
    tokens) in its first user message. Example:
    ``--workload chat:rate=20,turns_mean=8,think_s=10,system_prompts=4,doc_tokens=2000``.
    """

    rate: float = 10.0
    arrival: str = "poisson"
    system_tokens: int = 512
    turns_mean: float = 6.0
    turns_max: int = 40
    user_tokens: int = 150
    output_tokens: int = 200
    think_s: float = 15.0
    session_ids: bool = True
    system_prompts: int = 1
    doc_tokens: int = 0


@dataclass(frozen=True, slots=True)
class SystemPromptConfig:
    """Single-turn requests behind one of ``prompts`` long system prompts (Zipf).

    The shape of SGLang's "generated-shared-prefix" benchmark. Example:
    ``--workload system-prompt:prompts=64,zipf_s=0.8``.
    """

    rate: float = 20.0
    arrival: str = "poisson"
    prompts: int = 16
    system_tokens: int = 2048
    zipf_s: float = 1.0
    question_tokens: int = 128
    output_tokens: int = 256


@dataclass(frozen=True, slots=True)
class RagConfig:
    """Retrieval-augmented questions: large documents with Zipf popularity.

    Example: ``--workload rag:documents=2000,docs_per_request=2``.
    """

    rate: float = 8.0
    arrival: str = "poisson"
    documents: int = 500
    doc_tokens_min: int = 1000
    doc_tokens_max: int = 6000
    docs_per_request: int = 1
    zipf_s: float = 1.1
    system_tokens: int = 256
    question_tokens: int = 60
    output_tokens: int = 200


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Agent loops: many short turns (tool results) on a long, growing context.

    Each session belongs to one of ``agent_types`` (sharing its tool definitions),
    adds a task description, then loops. Example: ``--workload agent:turns_mean=40``.
    """

    rate: float = 20.0
    arrival: str = "poisson"
    agent_types: int = 4
    tools_tokens: int = 3000
    task_tokens: int = 1500
    turns_mean: float = 20.0
    turns_max: int = 120
    observation_tokens: int = 300
    output_tokens: int = 120
    think_s: float = 2.0
    session_ids: bool = True


@dataclass(frozen=True)
class SyntheticWorkload:
    """A synthetic workload: a name, its config, a seed and a rate scale."""

    name: str
    config: ChatConfig | SystemPromptConfig | RagConfig | AgentConfig
    seed: int = 0
    rate_scale: float = 1.0

    @property
    def arrival(self) -> ArrivalSpec:
        """The arrival process, with the rate scale applied."""
        return ArrivalSpec(self.config.arrival, self.config.rate * self.rate_scale)

    def requests(self) -> Iterator[SimRequest]:
        """A fresh request stream (same seed, same stream)."""
        config = self.config
        if isinstance(config, ChatConfig):
            return _chat(self.name, self.seed, self.arrival, config)
        if isinstance(config, SystemPromptConfig):
            return _system_prompt(self.name, self.seed, self.arrival, config)
        if isinstance(config, RagConfig):
            return _rag(self.name, self.seed, self.arrival, config)
        return _agent(self.name, self.seed, self.arrival, config)

    def describe(self) -> dict[str, Any]:
        """Name, seed, rate scale and every config field."""
        return {
            "name": self.name,
            "seed": self.seed,
            "rate_scale": self.rate_scale,
            **asdict(self.config),
        }


def _chat(name: str, seed: int, arrival: ArrivalSpec, c: ChatConfig) -> Iterator[SimRequest]:
    prompts = max(1, c.system_prompts)  # ids 0..prompts-1 are the system prompts

    def open_session(rng: random.Random, ids: _Ids, key: str) -> _Session:
        # Draw only what the options ask for, so the defaults keep their stream.
        system: Segment = (rng.randrange(prompts) if prompts > 1 else 0, c.system_tokens)
        context = [system]
        if c.doc_tokens > 0:
            context.append((ids.take(), _around(rng, c.doc_tokens)))
        return _Session(key, context, _turns(rng, c.turns_mean, c.turns_max))

    def next_turn(rng: random.Random, ids: _Ids, s: _Session) -> tuple[list[Segment], int]:
        return [(ids.take(), _around(rng, c.user_tokens))], _around(rng, c.output_tokens)

    return _session_stream(
        name,
        seed,
        arrival,
        turns_mean=c.turns_mean,
        think_s=c.think_s,
        open_session=open_session,
        next_turn=next_turn,
        session_ids=c.session_ids,
        reserved=prompts,
        # The system prompt and the first user message (the document and question).
        opening=3 if c.doc_tokens > 0 else 2,
    )


def _system_prompt(
    name: str, seed: int, arrival: ArrivalSpec, c: SystemPromptConfig
) -> Iterator[SimRequest]:
    zipf = ZipfSampler(c.prompts, c.zipf_s)  # ids 0..prompts-1 are the system prompts

    def build(rng: random.Random, ids: _Ids) -> tuple[list[Segment], int]:
        prompt = zipf.sample(rng)
        question = (ids.take(), _around(rng, c.question_tokens))
        return [(prompt, c.system_tokens), question], _around(rng, c.output_tokens)

    return _single_turn_stream(name, seed, arrival, build, reserved=c.prompts)


def _rag(name: str, seed: int, arrival: ArrivalSpec, c: RagConfig) -> Iterator[SimRequest]:
    zipf = ZipfSampler(c.documents, c.zipf_s)
    sizes = random.Random(f"{name}:{seed}:documents")
    doc_tokens = [sizes.randint(c.doc_tokens_min, c.doc_tokens_max) for _ in range(c.documents)]
    first_doc = 1  # id 0 is the system prompt; documents are 1..documents

    def build(rng: random.Random, ids: _Ids) -> tuple[list[Segment], int]:
        segments: list[Segment] = [(0, c.system_tokens)]
        for rank in zipf.distinct(rng, c.docs_per_request):
            segments.append((first_doc + rank, doc_tokens[rank]))
        segments.append((ids.take(), _around(rng, c.question_tokens)))
        return segments, _around(rng, c.output_tokens)

    return _single_turn_stream(name, seed, arrival, build, reserved=first_doc + c.documents)


def _agent(name: str, seed: int, arrival: ArrivalSpec, c: AgentConfig) -> Iterator[SimRequest]:
    def open_session(rng: random.Random, ids: _Ids, key: str) -> _Session:
        tools: Segment = (rng.randrange(c.agent_types), c.tools_tokens)
        task: Segment = (ids.take(), _around(rng, c.task_tokens))
        return _Session(key, [tools, task], _turns(rng, c.turns_mean, c.turns_max))

    def next_turn(rng: random.Random, ids: _Ids, s: _Session) -> tuple[list[Segment], int]:
        if s.turn == 0:
            return [], _around(rng, c.output_tokens)
        return [(ids.take(), _around(rng, c.observation_tokens))], _around(rng, c.output_tokens)

    return _session_stream(
        name,
        seed,
        arrival,
        turns_mean=c.turns_mean,
        think_s=c.think_s,
        open_session=open_session,
        next_turn=next_turn,
        session_ids=c.session_ids,
        reserved=c.agent_types,  # ids 0..agent_types-1 are the tool definitions
        opening=2,  # the tool definitions (system) and the task (user)
    )


WORKLOADS: dict[str, type[ChatConfig | SystemPromptConfig | RagConfig | AgentConfig]] = {
    "chat": ChatConfig,
    "system-prompt": SystemPromptConfig,
    "rag": RagConfig,
    "agent": AgentConfig,
}
"""Synthetic workloads by name (``--workload NAME[:key=value,...]``)."""


def parse_options(text: str) -> dict[str, str]:
    """``"a=1,b=x"`` -> ``{"a": "1", "b": "x"}``."""
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got {item!r}")
        options[key.strip()] = value.strip()
    return options


def _coerce(value: object, like: object) -> object:
    """``value`` converted to the type of the default ``like``."""
    if not isinstance(value, str):
        return value
    if isinstance(like, bool):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected a boolean, got {value!r}")
    if isinstance(like, int):
        return int(value)
    if isinstance(like, float):
        return float(value)
    return value


def build_workload(
    spec: str,
    seed: int = 0,
    rate_scale: float = 1.0,
    overrides: Mapping[str, object] | None = None,
) -> SyntheticWorkload:
    """A synthetic workload from ``NAME[:key=value,...]`` plus ``overrides``.

    Unknown names and unknown options raise ``ValueError`` listing what exists.
    """
    name, _, option_text = spec.partition(":")
    name = name.strip()
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    config_type = WORKLOADS[name]
    defaults = config_type()
    known = {f.name: getattr(defaults, f.name) for f in fields(config_type)}
    options: dict[str, object] = {**parse_options(option_text), **dict(overrides or {})}
    changes: dict[str, Any] = {}
    for key, value in options.items():
        if key not in known:
            raise ValueError(
                f"workload {name!r} has no option {key!r}; options: {', '.join(known)}"
            )
        changes[key] = _coerce(value, known[key])
    config = replace(defaults, **changes)
    ArrivalSpec(config.arrival, config.rate)  # validates the arrival kind and rate
    return SyntheticWorkload(name, config, seed, rate_scale)


def workload_options(name: str) -> tuple[str, ...]:
    """The option names a synthetic workload accepts (empty for unknown names)."""
    config_type = WORKLOADS.get(name)
    return tuple(f.name for f in fields(config_type)) if config_type else ()
