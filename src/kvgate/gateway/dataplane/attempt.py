"""The one owner of a request's attempt on a worker: lease, policy, passive health, outcome.

``Router.place`` returns an ``Attempt``: it has taken the worker's lease (the
worker's in-flight slot and KV estimate) and, once placed, told the policy
(``on_routed``). Whichever data plane carries the bytes (the built-in proxy and
relay, or an ext_proc stream) then reports the attempt's events to it::

    attempt.sent()                 the request is written to the worker (shares the
                                   prefix state the placement adds, once)
    attempt.answered(status)       the response's status and headers arrived
    attempt.token()                a chunk of the answer arrived (first: TTFT)
    attempt.usage(p, c, n)         the worker's usage (prompt, cached, completion)
    attempt.tool_call()            the answer ended its turn calling a tool
    attempt.completed()            the client has the whole answer
    attempt.failed(kind, status)   the worker failed it (``UpstreamError.kind``)
    attempt.cancelled()            abandoned: the client went, or the driver stopped

The first of the last three ends it, exactly once (later ones return ``None`` and
do nothing): the lease is given back, the policy told (``core.attempt.tell_policy``),
passive health given the judgement (a broken stream is a failure, whatever its
headers said), the version's outcome recorded and the end listeners told (the
``AttemptEnd``: time to first token, tokens, work queued ahead, chunk gaps, whether it
ended in a tool call: the tool-call plane books its session away from there).
``async with attempt`` cancels it on any path that left it running. A 5xx answer
that the request takes elsewhere is ``UNSETTLED``: the request's later attempts say
whose fault it was, and ``settle`` charges the worker (or not), once. After a
completed attempt, ``await attempt.refresh()`` renews the session's binding.

The pure rules (what ends it, how it is judged, what the policy hears) are
``core.attempt``'s, which the simulator steps in virtual time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kvgate.core.attempt import (
    DEADLINE,
    AttemptEnd,
    AttemptState,
    EndKind,
    Judgement,
    tell_policy,
)
from kvgate.core.decision import Affinity
from kvgate.core.features import RequestFeatures
from kvgate.core.policy import Policy
from kvgate.gateway.control.outcomes import OutcomeRecorder
from kvgate.types import BlockHash, SessionKey, WorkerId

if TYPE_CHECKING:
    from kvgate.gateway.observe.pool import Lease, Worker, WorkerPool


class Unread:
    """The store's binding was not read: nothing this request's verdict depends on needs it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNREAD"


UNREAD = Unread()
"""``Router.lookup``'s answer when the binding was not read."""

Looked = Affinity | None | Unread
"""A binding as looked up: found, missing (``None``), or not read (``UNREAD``)."""


class PassiveHealth(Protocol):
    """Where attempts' judgements go (outlier detection)."""

    def success(self, worker: Worker) -> None:
        """An attempt on ``worker`` ran to its end."""

    def failure(self, worker: Worker) -> None:
        """An attempt on ``worker`` failed (unreachable, 5xx, timed out, broken off)."""


class Bindings(Protocol):
    """The affinity store's writes an attempt makes (the router's)."""

    def share(self, writes: Sequence[tuple[BlockHash, WorkerId]], tenant: str = "") -> None:
        """Tell other replicas where this attempt's checkpoint blocks went (counted
        against the request's ``tenant``)."""

    async def touch(self, key: SessionKey) -> None:
        """Renew ``key``'s binding (errors are counted, never raised)."""

    async def remember(self, key: SessionKey, worker: WorkerId, version: str) -> None:
        """Bind a key the answer named (a response id) to the worker that made it."""

    async def follow(
        self, key: SessionKey, expected: WorkerId, worker: WorkerId, version: str
    ) -> None:
        """Move ``key``'s binding from ``expected`` to ``worker`` (compare-and-set)."""

    async def forget(self, key: SessionKey) -> None:
        """Drop ``key``'s binding: what it named is gone from its worker (errors counted)."""


UsageListener = Callable[[SessionKey, WorkerId, int, int | None], None]
"""Told of each attempt's usage that ends with some: its session, worker, prompt and
cached tokens (the pressure driver's context sizes; the slot plane's restore checks)."""

EndListener = Callable[[RequestFeatures, AttemptEnd], None]
"""Told every attempt's end (a speed estimator learns from it)."""


@dataclass(frozen=True, slots=True)
class AttemptParts:
    """What every attempt placed under one routing state reports to."""

    policy: Policy
    passive: PassiveHealth
    bindings: Bindings
    outcomes: OutcomeRecorder | None = None
    usage_listeners: tuple[UsageListener, ...] = ()
    end_listeners: tuple[EndListener, ...] = ()
    mono: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time


@dataclass(slots=True)
class _Sample:
    request: bytes
    response: bytes


class Attempt:
    """One attempt of a request on one worker: see the module docs for its events.

    A plain class (no dataclass machinery): one is made for every attempt.
    """

    __slots__ = (
        "_sample",
        "_settled",
        "affinity",
        "bound",
        "features",
        "lease",
        "parts",
        "queued_s",
        "reason",
        "shares",
        "started",
        "state",
        "version",
        "worker",
        "wrote_affinity",
    )

    def __init__(
        self,
        parts: AttemptParts,
        features: RequestFeatures,
        pool: WorkerPool,
        worker: Worker,
        kv_tokens: int,
        *,
        reason: str,
        version: str,
        queued_s: float = 0.0,
        started: float | None = None,
    ) -> None:
        now = parts.mono()
        routed = worker.routed
        self.parts = parts
        self.features = features
        self.reason = reason
        self.version = version
        self.queued_s = queued_s
        self.started: float = now if started is None else started
        """When the request reached the gateway (the driver's monotonic clock): the
        version outcome's latency and TTFT count from there (default: the placement)."""
        self.wrote_affinity = False
        self.bound: Affinity | None = None
        """The binding in force after this attempt's write (a retry expects it)."""
        self.affinity: Looked = UNREAD
        """The binding the request was placed with (``UNREAD``: never read)."""
        self.shares: Sequence[tuple[BlockHash, WorkerId]] = ()
        """Prefix-state writes, made by ``sent``."""
        self.state = AttemptState(
            worker.id,
            version,
            now,
            ahead_requests=routed.in_flight,
            ahead_kv_tokens=routed.kv_in_flight_tokens,
        )
        self._sample: _Sample | None = None
        self._settled = False
        self.worker = worker
        """The worker the attempt holds a slot on."""
        self.lease: Lease = pool.lease(worker, kv_tokens)
        """The attempt's slot on its worker: taken here, given back at its end."""

    @property
    def kv_tokens(self) -> int:
        """The KV demand counted in flight on ``worker`` (given back at the end)."""
        return self.lease.kv_tokens

    @property
    def ended(self) -> bool:
        """True once the attempt has ended."""
        return self.state.ended

    # -- before it is routed (the router) -------------------------------------------------

    def move(self, worker: Worker, version: str) -> None:
        """The attempt goes to ``worker`` instead: its slot moves there, and a policy told
        of the first placement hears it dropped there and routed here."""
        parts, routed = self.parts, self.state.is_routed
        if routed:
            parts.policy.on_dropped(self.features, self.worker.id, parts.wall())
        self.state.moved(worker.id, version)
        self.lease.move(worker)
        self.worker = worker
        self.version = version
        if routed:
            parts.policy.on_routed(self.features, worker.id, parts.wall())

    async def serve_on(self, worker: Worker, reason: str) -> None:
        """A native proxy served the request on ``worker``, not the one picked (its
        fallback): the attempt moves there (``move``) and so does the session's binding
        (compare-and-set from the picked worker: the KV is where the work was done)."""
        if self.ended or worker is self.worker:
            return
        picked = self.worker.id
        self.move(worker, worker.version)
        self.reason = reason
        key = self.features.affinity_key
        if key is not None:
            await self.parts.bindings.follow(key, picked, worker.id, worker.version)

    def routed(self) -> None:
        """Tell the policy of the placement; from now on it is owed the attempt's end."""
        self.parts.policy.on_routed(self.features, self.worker.id, self.parts.wall())
        self.state.routed(self.parts.mono())

    # -- events from the data plane ---------------------------------------------------------

    def sent(self) -> None:
        """The request is written to the worker: share what the placement adds, once."""
        routed = self.worker.routed
        signals = routed.signals
        self.state.sent(
            self.parts.mono(),
            routed.in_flight - 1,
            routed.kv_in_flight_tokens - self.lease.kv_tokens,
            signals.waiting if signals is not None else None,
        )
        writes = self.shares
        if writes:
            self.shares = ()
            self.parts.bindings.share(writes, self.features.tenant)

    def answered(self, status: int) -> None:
        """The response's status and headers arrived."""
        self.worker.heard_at = now = self.parts.mono()
        self.state.answered(now, status)

    def token(self, at: float | None = None) -> None:
        """A chunk of the answer arrived (at ``at`` on the monotonic clock, default now); the
        first tells a routed policy the prefill is done (``Policy.on_first_token``)."""
        state = self.state
        first = state.first_token_at is None and state.is_routed and not state.ended
        self.worker.heard_at = now = self.parts.mono() if at is None else at
        state.token(now)
        if first:
            self.parts.policy.on_first_token(self.features, self.worker.id, self.parts.wall())

    def usage(
        self, prompt: int, cached: int, completion: int, engine_ttft: float | None = None
    ) -> None:
        """The worker's usage was read (with the engine's own TTFT, where it reports one)."""
        self.state.usage(prompt, cached, completion, engine_ttft)

    def tool_call(self) -> None:
        """The answer ended its turn calling a tool (its end says so to the listeners)."""
        self.state.tool_call(self.parts.mono())

    def keep_sample(self, request: bytes, response: bytes) -> None:
        """Hand this answer to the quality evaluator if the attempt completes."""
        self._sample = _Sample(request, response)

    def completed(self) -> AttemptEnd | None:
        """The client has the whole answer: the attempt's end (``None``: it had ended)."""
        return self._ended(self.state.completed(self.parts.mono()))

    def failed(self, kind: str, status: int | None = None) -> AttemptEnd | None:
        """The worker failed the attempt: its end (``None``: it had ended).

        A non-streamed answer's head comes with all of it, so its wait timing out measures
        the length the client asked for (``max_tokens``) as much as the worker: while the
        worker showed life meanwhile it was not silent, and the timeout is the request's
        (``core.attempt.DEADLINE``: not charged). A worker silent to everyone is.
        """
        if kind == "timeout" and not self.features.stream and self._alive_since_sent():
            kind = DEADLINE
        return self._ended(self.state.failed(self.parts.mono(), kind, status))

    def _alive_since_sent(self) -> bool:
        """Whether the worker showed life after this attempt was sent: an answer to another
        request brought a byte, or two of its scrapes taken since say its engine generated
        tokens between them (``Worker.progress_at``: this request's, on an idle fleet)."""
        sent = self.state.sent_at
        worker = self.worker
        return sent is not None and (worker.heard_at > sent or worker.progress_at >= sent)

    def cancelled(self) -> AttemptEnd | None:
        """The attempt was abandoned: its end (``None``: it had ended)."""
        return self._ended(self.state.cancelled(self.parts.mono()))

    def settle(self, fault: bool) -> None:
        """Say whose fault an ``UNSETTLED`` end was: ``fault`` charges the worker and its
        version; either way it is settled, once. Nothing for any other end."""
        end = self.state.end
        if end is None or end.judgement is not _UNSETTLED or self._settled:
            return
        self._settled = True
        if fault:
            self._charge()

    @property
    def renews(self) -> bool:
        """True when a completed attempt renews its session's binding (``refresh``): it
        has one, read by the placement, and did not write it itself."""
        return (
            self.features.affinity_key is not None
            and not self.wrote_affinity
            and not isinstance(self.affinity, Unread)
        )

    async def refresh(self) -> None:
        """After a completed attempt: renew the session's binding (when ``renews``)."""
        key = self.features.affinity_key
        if key is not None and self.renews:
            await self.parts.bindings.touch(key)

    async def remember(self, key: SessionKey) -> None:
        """Bind ``key`` (named by the answer) to this attempt's worker and version."""
        await self.parts.bindings.remember(key, self.worker.id, self.version)

    async def forget(self, key: SessionKey) -> None:
        """Drop ``key``'s binding: its worker confirmed what it named is deleted."""
        await self.parts.bindings.forget(key)

    async def __aenter__(self) -> Attempt:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancelled()

    # -- the end, once ----------------------------------------------------------------------

    def _ended(self, end: AttemptEnd | None) -> AttemptEnd | None:
        if end is None:
            return None
        parts, features = self.parts, self.features
        self.lease.release()  # first: waiters need not wait on the feedback below
        tell_policy(parts.policy, features, end, parts.wall())
        judgement = end.judgement
        if judgement is _OK:
            parts.passive.success(self.worker)
        elif judgement is _FAULT:
            self._charge()
        recorder = parts.outcomes
        if recorder is not None and judgement is _OK and end.kind is _COMPLETED:
            ok = end.status < 400
            started = self.started
            first = end.first_token_at
            recorder.finished(
                features.model,
                end.version,
                error=False,
                latency_s=end.ended_at - started if ok else None,
                ttft_s=first - started if ok and first is not None else None,
            )
            sample = self._sample
            if sample is not None and ok:
                recorder.sample(features.model, end.version, sample.request, sample.response)
        key = features.affinity_key
        if key is not None and end.prompt_tokens is not None:
            for listener in parts.usage_listeners:
                listener(key, end.worker, end.prompt_tokens, end.cached_tokens)
        for told in parts.end_listeners:
            told(features, end)
        return end

    def _charge(self) -> None:
        """The worker failed this attempt: outlier detection and its version's errors."""
        self.parts.passive.failure(self.worker)
        if self.parts.outcomes is not None:
            self.parts.outcomes.attempt_failed(self.features.model, self.state.version)


_OK, _FAULT, _UNSETTLED = Judgement.OK, Judgement.FAULT, Judgement.UNSETTLED
_COMPLETED = EndKind.COMPLETED
"""Module constants: on 3.11 each ``Enum.MEMBER`` is a slow ``EnumType`` lookup."""


class Placer(Protocol):
    """What a data plane asks of the router: a binding, an attempt, the stable version."""

    async def lookup(self, features: RequestFeatures) -> Looked:
        """The store's binding for the request's affinity key (or ``UNREAD``)."""

    async def read(self, key: SessionKey) -> Affinity | None:
        """The store's binding for ``key``, read whatever the policy reads."""

    async def place(
        self,
        features: RequestFeatures,
        looked: Looked,
        excluded: frozenset[WorkerId] = frozenset(),
        version: str | None = None,
        *,
        started: float | None = None,
    ) -> Attempt:
        """A placed, routed attempt (``NoHealthyWorkerError``, ``OverloadedError``)."""

    def stable_version(self, model: str) -> str | None:
        """The stable version of ``model`` (``None``: not split)."""
