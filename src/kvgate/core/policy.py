"""The policy interface every routing policy implements, and its context.

A policy is a plain object: ``pick`` takes a snapshot and returns a ``Decision``
without I/O. Stateful policies (the prefix index) learn through the hooks, which
default to doing nothing. The driver (live gateway or simulator) calls them.
"""

from __future__ import annotations

import random
from collections.abc import (
    Collection,
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    Mapping,
    ValuesView,
)
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvgate.core.decision import Affinity, Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import FleetSnapshot
from kvgate.core.speed import Observation, SpeedReport
from kvgate.core.warmup import WarmUp
from kvgate.types import Seconds, WorkerId


@dataclass(frozen=True, slots=True)
class Resident:
    """What the engines that publish KV events hold of one request's prompt.

    Read from the exact index (``core.exact_index``) by the driver before routing:
    ``chars`` is, per worker, how many leading characters of the prompt its cache
    holds (its tokens held, in the prompt's characters); ``exact`` the workers whose
    cache is known this way. A worker in ``exact`` but not in ``chars`` holds none
    of the prompt, whatever was sent there. Workers outside ``exact`` publish no
    events: a policy reads their caches from its own approximate index.
    """

    chars: Mapping[WorkerId, int]
    exact: Collection[WorkerId]
    groups: tuple[tuple[int, tuple[WorkerId, ...]], ...] | None = None
    """``chars`` by count, where the driver had it so: ``(chars held, the workers holding
    that many)``, each worker once (a lookup's few depths, not one entry a worker)."""

    @classmethod
    def of_tokens(
        cls,
        groups: Iterable[tuple[int, Iterable[WorkerId]]],
        prompt_tokens: int,
        prompt_chars: int,
        exact: Collection[WorkerId],
    ) -> Resident:
        """From the exact index's answer by count (``ExactIndex.held_token_groups``:
        leading tokens held, the workers holding that many), in the prompt's characters
        (``prompt_chars`` over ``prompt_tokens`` a token): one conversion a count."""
        per_token = prompt_chars / prompt_tokens if prompt_tokens else 0.0
        by_chars = []
        for held, workers in groups:
            chars = int(held * per_token)
            by_chars.append((chars if chars < prompt_chars else prompt_chars, tuple(workers)))
        grouped = tuple(by_chars)
        return cls(_GroupedChars(grouped), exact, grouped)


class _GroupedChars(Mapping[WorkerId, int]):
    """``Resident.chars`` of a lookup's groups, made per worker only when read: ``default``
    reads the groups, and 64 workers made one by one were ~45k instructions a decision."""

    __slots__ = ("_chars", "_groups")

    def __init__(self, groups: tuple[tuple[int, tuple[WorkerId, ...]], ...]) -> None:
        self._groups = groups
        self._chars: dict[WorkerId, int] | None = None

    def _made(self) -> dict[WorkerId, int]:
        chars = self._chars
        if chars is None:
            chars = self._chars = {}
            for held, workers in self._groups:
                chars.update(dict.fromkeys(workers, held))
        return chars

    def __getitem__(self, worker: WorkerId) -> int:
        return self._made()[worker]

    def get(self, worker: WorkerId, default: int | None = None) -> int | None:  # type: ignore[override]
        return self._made().get(worker, default)

    def __contains__(self, worker: object) -> bool:
        return worker in self._made()

    def __iter__(self) -> Iterator[WorkerId]:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())

    def keys(self) -> KeysView[WorkerId]:
        return self._made().keys()

    def items(self) -> ItemsView[WorkerId, int]:
        return self._made().items()

    def values(self) -> ValuesView[int]:
        return self._made().values()

    def __repr__(self) -> str:
        return repr(self._made())


@dataclass(frozen=True, slots=True)
class RouteContext:
    """What the driver looked up before asking a policy.

    ``affinity`` is the store's binding for the request's session key (``None``
    if the request has no key or the key is unknown). ``rng`` is the driver's
    seeded random source: policies never use module-level ``random``.
    ``holders`` is the shared store's prefix state (``core.holders``): for each
    worker, the depth in blocks of the request's chain that some gateway replica
    sent there lately, so replica B knows where replica A sent a conversation's
    earlier turn. ``resident`` is what workers that publish KV events hold of the
    request's prompt, exactly (``None``: no worker publishes them).
    """

    fleet: FleetSnapshot
    affinity: Affinity | None
    rng: random.Random
    holders: Mapping[WorkerId, int] = field(default_factory=dict)
    resident: Resident | None = None


@runtime_checkable
class Policy(Protocol):
    """A routing policy: pure ``pick`` plus optional learning hooks."""

    name: str
    reads_affinity: bool
    """Whether ``pick`` reads ``ctx.affinity`` or ``ctx.holders``, or writes bindings
    (False: the driver may skip those store reads, ``core.route.needs_affinity``)."""

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        """Choose a worker (or refuse) for ``request``; must not do I/O."""
        ...

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """The driver sent ``request`` to ``worker`` (after the decision was applied)."""
        ...

    def on_usage(
        self,
        request: RequestFeatures,
        worker: WorkerId,
        prompt_tokens: int,
        cached_tokens: int,
        now: Seconds,
        *,
        completion_tokens: int = 0,
    ) -> None:
        """The worker reported ``usage`` for ``request`` (cache feedback;
        ``completion_tokens`` 0: not reported)."""
        ...

    def on_dropped(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """``request`` left ``worker`` with no ``usage`` reported (the attempt failed, or
        its client went away before the answer's end): forget what was owed for it there."""
        ...

    def on_first_token(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """``request``'s first token came from ``worker`` at ``now`` (its prefill is done)."""
        ...

    def on_observed(
        self, request: RequestFeatures, worker: WorkerId, observed: Observation, now: Seconds
    ) -> None:
        """What the gateway measured of ``request``'s attempt on ``worker`` (its TTFT, usage,
        token times), at the attempt's end, after ``on_usage``: a policy that learns the
        workers' speed (``core.speed``) fits it here."""
        ...

    def speeds(self) -> Mapping[WorkerId, SpeedReport]:
        """Each worker's learned speed and TTFT prediction error, for ``/metrics`` (empty:
        this policy learns none)."""
        ...

    def on_worker_removed(self, worker: WorkerId) -> None:
        """``worker`` left the fleet: forget what is known about it."""
        ...

    def hold_worth(
        self, request: RequestFeatures, worker: WorkerId, ctx: RouteContext
    ) -> Seconds | None:
        """How much waiting for KV room on ``worker`` (this policy's pick for ``request``)
        is worth, in the driver's clock: how much sooner it would start there than on the
        best other worker. 0: nothing, and the KV hold sends it where there is room;
        ``None``: no measure, and the hold waits for that worker as long as it may
        (``core.route``)."""
        ...

    def openers(self) -> Collection[str]:
        """Ids of requests a later ``warm_up`` may cut a prefix from (the driver keeps
        their bodies; ``core.warmup``)."""
        ...

    def warm_up(self, worker: WorkerId, ctx: RouteContext) -> WarmUp | None:
        """After a placement on ``worker``: a prefix to compute ahead on an idle worker."""
        ...

    def on_warm(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """The driver sent the warm-up ``request`` to ``worker``."""
        ...

    def on_warm_done(
        self,
        request: RequestFeatures,
        worker: WorkerId,
        prompt_tokens: int,
        cached_tokens: int,
        now: Seconds,
    ) -> None:
        """The warm-up ended (``prompt_tokens`` 0: it failed)."""
        ...


class PolicyBase:
    """Convenience base with no-op hooks; policies override what they need."""

    name: str = "base"
    reads_affinity: bool = True
    """Safe default: a policy that ignores bindings says so (``reads_affinity = False``)."""

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        raise NotImplementedError

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        return None

    def on_usage(
        self,
        request: RequestFeatures,
        worker: WorkerId,
        prompt_tokens: int,
        cached_tokens: int,
        now: Seconds,
        *,
        completion_tokens: int = 0,
    ) -> None:
        return None

    def on_dropped(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        return None

    def on_first_token(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        return None

    def on_observed(
        self, request: RequestFeatures, worker: WorkerId, observed: Observation, now: Seconds
    ) -> None:
        return None

    def speeds(self) -> Mapping[WorkerId, SpeedReport]:
        return {}

    def on_worker_removed(self, worker: WorkerId) -> None:
        return None

    def hold_worth(
        self, request: RequestFeatures, worker: WorkerId, ctx: RouteContext
    ) -> Seconds | None:
        return None

    def openers(self) -> Collection[str]:
        return ()

    def warm_up(self, worker: WorkerId, ctx: RouteContext) -> WarmUp | None:
        return None

    def on_warm(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        return None

    def on_warm_done(
        self,
        request: RequestFeatures,
        worker: WorkerId,
        prompt_tokens: int,
        cached_tokens: int,
        now: Seconds,
    ) -> None:
        return None
