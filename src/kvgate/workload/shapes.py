"""Workload shapes that test a cache-aware router at its edges.

The synthetic workloads of ``kvgate.workload.synthetic`` give every conversation
an opening of its own. Two of these do not, and that is the point (issue 11): a
prompt-block trace in which every prompt opens with the same block, and
SGLang's "generated shared prefix" groups. Both send no session id, so a router
can follow a conversation only by its own prefix chain, never by a key derived
from the text everyone shares. The third shares nothing at all (issue 46):
uniform one-shot prompts, where a router can win only by balancing.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from kvgate.workload.arrivals import ArrivalSpec, RatedArrivals
from kvgate.workload.request import Segment, SimRequest
from kvgate.workload.streams import (
    Ids,
    Session,
    around,
    session_stream,
    single_turn_stream,
    turns,
)


@dataclass(frozen=True, slots=True)
class SharedOpeningTraceConfig(RatedArrivals):
    """A long-context conversation trace in Mooncake's shape, every prompt opening alike.

    Prompts are runs of ``block_tokens``-token blocks (Mooncake's ``hash_ids``):
    one of ``openings`` shared opening blocks of ``opening_tokens`` (1: the same
    block for everyone), then the conversation's own blocks; each later turn
    re-sends the earlier turn's blocks and appends about ``turn_blocks`` new ones.
    Like a trace of prompt blocks, output is not re-sent, no session id is given,
    and each prompt ends in a partial block of its own. Requests go to
    ``/v1/completions``. With the defaults the working set is several times a
    small fleet's KV: the cache, not the router, is the limit. Example:
    ``--workload shared-opening-trace:rate=2,first_blocks=32,openings=3``.
    """

    rate: float = 3.0
    arrival: str = "poisson"
    openings: int = 1
    opening_tokens: int = 512
    block_tokens: int = 512
    first_blocks: int = 20
    turn_blocks: int = 6
    turns_mean: float = 2.0
    turns_max: int = 20
    think_s: float = 60.0
    output_tokens: int = 150

    def stream(self, name: str, seed: int, arrival: ArrivalSpec) -> Iterator[SimRequest]:
        """The request stream (see the class docstring)."""
        openings = max(1, self.openings)  # ids 0..openings-1 are the shared openings
        block = max(1, self.block_tokens)

        def blocks(ids: Ids, n: int) -> list[Segment]:
            first = ids.take(n)
            return [(first + i, block) for i in range(n)]

        def open_session(rng: random.Random, ids: Ids, key: str) -> Session:
            shared: Segment = (rng.randrange(openings) if openings > 1 else 0, self.opening_tokens)
            own = blocks(ids, around(rng, self.first_blocks))
            return Session(key, [shared, *own], turns(rng, self.turns_mean, self.turns_max))

        def next_turn(rng: random.Random, ids: Ids, s: Session) -> tuple[list[Segment], int]:
            if s.turn > 0:
                # The previous turn's private tail is gone; its full blocks stay.
                s.context.pop()
                s.context.extend(blocks(ids, around(rng, self.turn_blocks)))
            tail: Segment = (ids.take(), rng.randint(1, block - 1) if block > 1 else 1)
            return [tail], around(rng, self.output_tokens)

        return session_stream(
            name,
            seed,
            arrival,
            turns_mean=self.turns_mean,
            think_s=self.think_s,
            open_session=open_session,
            next_turn=next_turn,
            session_ids=False,
            reserved=openings,
            opening=0,  # a completions prompt, as a trace replays
            replies=False,
        )


@dataclass(frozen=True, slots=True)
class PrefixGroupsConfig(RatedArrivals):
    """SGLang's "generated shared prefix" benchmark: ``groups`` x ``prompts`` chat requests.

    Each group has a long system prompt of its own (``system_tokens``); each of its
    ``prompts`` requests asks one short question (about ``question_tokens``). All
    ``groups * prompts`` requests are shuffled by the seed and arrive at ``rate``
    (a high rate plus a client concurrency limit replays SGLang's "all at once,
    N in flight"); the stream then ends. No session header. Example:
    ``--workload shared-prefix-groups:groups=64,prompts=16,system_tokens=4096``.
    """

    rate: float = 64.0
    arrival: str = "poisson"
    groups: int = 16
    prompts: int = 8
    system_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 256

    def stream(self, name: str, seed: int, arrival: ArrivalSpec) -> Iterator[SimRequest]:
        """The request stream (see the class docstring)."""
        rng = random.Random(f"{name}:{seed}")
        groups = max(1, self.groups)  # ids 0..groups-1 are the system prompts
        ids = Ids(groups)
        order = [g for g in range(groups) for _ in range(max(1, self.prompts))]
        rng.shuffle(order)
        times = arrival.times(random.Random(f"{name}:{seed}:arrivals"))
        for n, (group, at) in enumerate(zip(order, times, strict=False)):
            question: Segment = (ids.take(), around(rng, self.question_tokens))
            yield SimRequest.of(
                at,
                f"r{n}",
                ((group, self.system_tokens), question),
                around(rng, self.output_tokens),
                opening=2,  # a system message and one user message
            )


@dataclass(frozen=True, slots=True)
class UniformConfig(RatedArrivals):
    """One-shot requests that share no prefix at all: nothing to hit, only load to balance.

    Each request is a single user message of its own text (about ``prompt_tokens``)
    and asks for about ``output_tokens``; none shares even a first block with
    another. With a rate above what the fleet serves and a client concurrency cap
    (the judge's scenario keeps 48 in flight), the clients always have that many
    out, as a throughput benchmark does: the shape where a KV-aware router must not
    lose to round robin, above all on a fleet of unequal workers. Example:
    ``--workload uniform:rate=60,prompt_tokens=1024``.
    """

    rate: float = 60.0
    arrival: str = "poisson"
    prompt_tokens: int = 1024
    output_tokens: int = 128

    def stream(self, name: str, seed: int, arrival: ArrivalSpec) -> Iterator[SimRequest]:
        """The request stream (see the class docstring)."""

        def build(rng: random.Random, ids: Ids) -> tuple[list[Segment], int]:
            own: Segment = (ids.take(), around(rng, self.prompt_tokens))
            return [own], around(rng, self.output_tokens)

        return single_turn_stream(name, seed, arrival, build, reserved=0)
