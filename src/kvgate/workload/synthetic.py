"""Synthetic workloads: chat, shared system prompts, RAG, agent loops, shared openings, uniform.

Each workload is a config dataclass (defaults that mean something) that knows
its arrival process and builds a fresh, endless-or-bounded iterator of
``SimRequest`` in arrival order. Rates are in requests per second across the
whole fleet; session workloads start sessions at ``rate / turns_mean`` so the
request rate comes out right (or keep a fixed number of sessions open).

``WORKLOADS`` names each workload by its default config, so one generator can
stand for several shapes (``headerless-chat`` is chat without session ids and
with shared system prompts). ``vary=V`` draws every option not given
explicitly from a seeded log-uniform band of factor ``1+V`` around its default,
so a policy can be tried on instances of a shape nobody tuned on.

Arrivals are open-loop: a session's next turn comes one think time after the
previous turn's arrival, whatever the fleet did, as in trace replay.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, Protocol

from kvgate.workload.agents import AgentToolsConfig
from kvgate.workload.arrivals import ArrivalSpec, RatedArrivals
from kvgate.workload.request import Segment, SimRequest
from kvgate.workload.shapes import PrefixGroupsConfig, SharedOpeningTraceConfig, UniformConfig
from kvgate.workload.streams import (
    Ids,
    Session,
    ZipfSampler,
    around,
    session_stream,
    single_turn_stream,
    turns,
)

__all__ = [
    "WORKLOADS",
    "AgentConfig",
    "AgentToolsConfig",
    "ChatConfig",
    "PrefixGroupsConfig",
    "RagConfig",
    "SharedOpeningTraceConfig",
    "SyntheticWorkload",
    "SystemPromptConfig",
    "UniformConfig",
    "Workload",
    "WorkloadConfig",
    "ZipfSampler",
    "build_workload",
    "parse_options",
    "workload_options",
]


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


class WorkloadConfig(Protocol):
    """A synthetic workload's parameters (a dataclass): its arrival process and stream."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    def arrival_spec(self) -> ArrivalSpec:
        """The arrival process at the configured rate (before any rate scale)."""
        ...

    def stream(self, name: str, seed: int, arrival: ArrivalSpec) -> Iterator[SimRequest]:
        """A fresh request stream arriving by ``arrival``."""
        ...


@dataclass(frozen=True, slots=True)
class ChatConfig(RatedArrivals):
    """Multi-turn chat: shared system prompts, sessions whose context grows.

    Each session uses one of ``system_prompts`` system prompts (uniformly) and,
    with ``doc_tokens`` > 0, opens with a document of its own (about that many
    tokens) in its first user message. ``sessions`` > 0 keeps that many sessions
    open at once instead of starting them at a rate (then about
    ``sessions / think_s`` requests per second). Example:
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
    sessions: int = 0

    def stream(self, name: str, seed: int, arrival: ArrivalSpec) -> Iterator[SimRequest]:
        """The request stream (see the class docstring)."""
        return _chat(name, seed, arrival, self)


@dataclass(frozen=True, slots=True)
class SystemPromptConfig(RatedArrivals):
    """Single-turn requests behind one of ``prompts`` long system prompts (Zipf).

    An endless variant of SGLang's "generated-shared-prefix" benchmark (its exact
    shape is ``shared-prefix-groups``). Example:
    ``--workload system-prompt:prompts=64,zipf_s=0.8``.
    """

    rate: float = 20.0
    arrival: str = "poisson"
    prompts: int = 16
    system_tokens: int = 2048
    zipf_s: float = 1.0
    question_tokens: int = 128
    output_tokens: int = 256

    def stream(self, name: str, seed: int, arrival: ArrivalSpec) -> Iterator[SimRequest]:
        """The request stream (see the class docstring)."""
        return _system_prompt(name, seed, arrival, self)


@dataclass(frozen=True, slots=True)
class RagConfig(RatedArrivals):
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

    def stream(self, name: str, seed: int, arrival: ArrivalSpec) -> Iterator[SimRequest]:
        """The request stream (see the class docstring)."""
        return _rag(name, seed, arrival, self)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Agent loops: many short turns (tool results) on a long, growing context.

    Each session belongs to one of ``agent_types`` (sharing its tool definitions),
    adds a task description, then loops. ``arrival=bursty`` starts agents in
    bursts of mean ``burst_on_s`` separated by silences of mean ``burst_off_s``.
    Example: ``--workload agent:turns_mean=40``.
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
    burst_on_s: float = 5.0
    burst_off_s: float = 15.0

    def arrival_spec(self) -> ArrivalSpec:
        """The arrival process at the configured rate."""
        return ArrivalSpec(self.arrival, self.rate, self.burst_on_s, self.burst_off_s)

    def stream(self, name: str, seed: int, arrival: ArrivalSpec) -> Iterator[SimRequest]:
        """The request stream (see the class docstring)."""
        return _agent(name, seed, arrival, self)


@dataclass(frozen=True)
class SyntheticWorkload:
    """A synthetic workload: a name, its config, a seed and a rate scale."""

    name: str
    config: WorkloadConfig
    seed: int = 0
    rate_scale: float = 1.0

    @property
    def arrival(self) -> ArrivalSpec:
        """The arrival process, with the rate scale applied."""
        return self.config.arrival_spec().scaled(self.rate_scale)

    def requests(self) -> Iterator[SimRequest]:
        """A fresh request stream (same seed, same stream)."""
        return self.config.stream(self.name, self.seed, self.arrival)

    def describe(self) -> dict[str, Any]:
        """Name, seed, rate scale and every config field."""
        options: dict[str, Any] = asdict(self.config)
        return {"name": self.name, "seed": self.seed, "rate_scale": self.rate_scale, **options}


def _chat(name: str, seed: int, arrival: ArrivalSpec, c: ChatConfig) -> Iterator[SimRequest]:
    prompts = max(1, c.system_prompts)  # ids 0..prompts-1 are the system prompts

    def open_session(rng: random.Random, ids: Ids, key: str) -> Session:
        # Draw only what the options ask for, so the defaults keep their stream.
        system: Segment = (rng.randrange(prompts) if prompts > 1 else 0, c.system_tokens)
        context = [system]
        if c.doc_tokens > 0:
            context.append((ids.take(), around(rng, c.doc_tokens)))
        return Session(key, context, turns(rng, c.turns_mean, c.turns_max))

    def next_turn(rng: random.Random, ids: Ids, s: Session) -> tuple[list[Segment], int]:
        return [(ids.take(), around(rng, c.user_tokens))], around(rng, c.output_tokens)

    return session_stream(
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
        population=c.sessions,
    )


def _system_prompt(
    name: str, seed: int, arrival: ArrivalSpec, c: SystemPromptConfig
) -> Iterator[SimRequest]:
    zipf = ZipfSampler(c.prompts, c.zipf_s)  # ids 0..prompts-1 are the system prompts

    def build(rng: random.Random, ids: Ids) -> tuple[list[Segment], int]:
        prompt = zipf.sample(rng)
        question = (ids.take(), around(rng, c.question_tokens))
        return [(prompt, c.system_tokens), question], around(rng, c.output_tokens)

    return single_turn_stream(name, seed, arrival, build, reserved=c.prompts)


def _rag(name: str, seed: int, arrival: ArrivalSpec, c: RagConfig) -> Iterator[SimRequest]:
    zipf = ZipfSampler(c.documents, c.zipf_s)
    sizes = random.Random(f"{name}:{seed}:documents")
    doc_tokens = [sizes.randint(c.doc_tokens_min, c.doc_tokens_max) for _ in range(c.documents)]
    first_doc = 1  # id 0 is the system prompt; documents are 1..documents

    def build(rng: random.Random, ids: Ids) -> tuple[list[Segment], int]:
        segments: list[Segment] = [(0, c.system_tokens)]
        for rank in zipf.distinct(rng, c.docs_per_request):
            segments.append((first_doc + rank, doc_tokens[rank]))
        segments.append((ids.take(), around(rng, c.question_tokens)))
        return segments, around(rng, c.output_tokens)

    return single_turn_stream(name, seed, arrival, build, reserved=first_doc + c.documents)


def _agent(name: str, seed: int, arrival: ArrivalSpec, c: AgentConfig) -> Iterator[SimRequest]:
    def open_session(rng: random.Random, ids: Ids, key: str) -> Session:
        tools: Segment = (rng.randrange(c.agent_types), c.tools_tokens)
        task: Segment = (ids.take(), around(rng, c.task_tokens))
        return Session(key, [tools, task], turns(rng, c.turns_mean, c.turns_max))

    def next_turn(rng: random.Random, ids: Ids, s: Session) -> tuple[list[Segment], int]:
        if s.turn == 0:
            return [], around(rng, c.output_tokens)
        return [(ids.take(), around(rng, c.observation_tokens))], around(rng, c.output_tokens)

    return session_stream(
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


WORKLOADS: dict[str, WorkloadConfig] = {
    "chat": ChatConfig(),
    "system-prompt": SystemPromptConfig(),
    "rag": RagConfig(),
    "agent": AgentConfig(),
    # The shapes of issue 11: text shared by strangers, mostly without session ids.
    "shared-opening-trace": SharedOpeningTraceConfig(),
    "shared-prefix-groups": PrefixGroupsConfig(),
    # Issue 46: no reuse at all (only balance counts), and SGLang's groups at its
    # second size (24 groups of 10 prompts; the 16 x 8 default is above).
    "uniform": UniformConfig(),
    "shared-prefix-groups-24x10": PrefixGroupsConfig(groups=24, prompts=10),
    # Multi-turn chat with neither a session header nor ``user``: only the turns'
    # own prefix chain ties a conversation together, behind 4 shared system prompts.
    "headerless-chat": ChatConfig(
        rate=8.0, system_tokens=1024, system_prompts=4, session_ids=False, think_s=20.0
    ),
    # Agents behind one common tool preamble, each loop extending its own chain.
    "agent-preamble": AgentConfig(
        rate=10.0,
        agent_types=1,
        tools_tokens=4096,
        task_tokens=800,
        turns_mean=12.0,
        think_s=3.0,
        session_ids=False,
    ),
    # Issue 49: agents calling tools behind one 4,096-token preamble, 10-40 turns,
    # heavy-tailed tool pauses, subagents naming their parent (``workload.agents``).
    "agent-tools": AgentToolsConfig(),
    # Sessions WITH ``X-Session-ID``: ~4k-token documents, 32 sessions open at once.
    "session-docs": ChatConfig(
        system_tokens=512,
        system_prompts=4,
        doc_tokens=4000,
        sessions=32,
        think_s=8.0,
        turns_mean=6.0,
        user_tokens=100,
        output_tokens=150,
    ),
}
"""Synthetic workloads by name, each its default config (``--workload NAME[:key=value,...]``)."""

VARY_OPTION = "vary"
"""The option that jitters every option left at its default (see the module docstring)."""


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


def _varied(defaults: Mapping[str, object], spread: float, rng: random.Random) -> dict[str, Any]:
    """Every numeric default times a log-uniform factor in ``[1/(1+spread), 1+spread]``.

    Integers are rounded and keep their sign of zero (an option at 0 means "off"
    and stays off); booleans and names are kept.
    """
    width = math.log1p(spread)
    out: dict[str, Any] = {}
    for key, value in defaults.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        factor = math.exp(rng.uniform(-width, width))
        if isinstance(value, int):
            out[key] = max(1, round(value * factor)) if value > 0 else value
        else:
            out[key] = value * factor
    return out


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
    defaults = WORKLOADS[name]
    known = {f.name: getattr(defaults, f.name) for f in fields(defaults)}
    options: dict[str, object] = {**parse_options(option_text), **dict(overrides or {})}
    spread = float(str(options.pop(VARY_OPTION, 0.0)))
    if not 0.0 <= spread <= 10.0:
        raise ValueError(f"{VARY_OPTION} must be between 0 and 10, got {spread}")
    changes: dict[str, Any] = {}
    if spread > 0:
        changes.update(_varied(known, spread, random.Random(f"{name}:{seed}:{VARY_OPTION}")))
    for key, value in options.items():
        if key not in known:
            raise ValueError(
                f"workload {name!r} has no option {key!r}; options: {', '.join(known)}, "
                f"{VARY_OPTION}"
            )
        changes[key] = _coerce(value, known[key])
    config: WorkloadConfig = replace(defaults, **changes)
    config.arrival_spec()  # validates the arrival kind and rate
    return SyntheticWorkload(name, config, seed, rate_scale)


def workload_options(name: str) -> tuple[str, ...]:
    """The option names a synthetic workload accepts (empty for unknown names)."""
    defaults = WORKLOADS.get(name)
    if defaults is None:
        return ()
    return (*(f.name for f in fields(defaults)), VARY_OPTION)
