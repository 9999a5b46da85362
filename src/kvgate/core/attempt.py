"""One attempt of a request on one worker, as a pure state machine: events in, one end out.

An attempt begins when a driver places a request on a worker (it holds the worker's
lease) and ends exactly once, on whichever path: the answer ran to its end, the
worker failed it, or the client went away. Whichever data plane carries the bytes
(the built-in proxy, an Envoy ext_proc stream, the simulator in virtual time) feeds
the same events, with the time it read from its own clock::

    routed(at)            the policy was told of the placement (``on_routed``)
    sent(at, ahead)       the request is written to the worker, with the work queued
                          ahead of it there then (``Ahead``)
    answered(at, status)  the response's status line and headers arrived
    token(at)             a chunk of the answer arrived (the first one is the first token)
    usage(prompt, cached, completion)   the worker's ``usage`` was read
    tool_call(at)         the answer ended its turn calling a tool (``finish_reason:
                          tool_calls``, ``stop_reason: tool_use``): its session is coming back
    completed(at)         the answer reached its end (the client has all of it)
    failed(at, kind, status)            the worker failed it (see ``Judgement``)
    cancelled(at)         the attempt was abandoned: the client went, or its driver stopped

The first of ``completed``, ``failed`` and ``cancelled`` ends the attempt and returns
its ``AttemptEnd``; every later event returns ``None`` and changes nothing, so a driver
may report an end from every path (a ``finally`` included) and it counts once. The
end says everything the driver must then do, once: give the lease back, tell the
policy (``tell_policy``: its usage, or that nothing more is owed), give passive health
its ``judgement``, book its session away if it went to run a tool (``core.toolcalls.
leaves_away``), and record the outcome; it also carries what a speed estimator learns
from (time to first token, tokens, the work queued ahead at placement, the gaps between
chunks).

An attempt is judged by how it *ends*, never by its response headers: a worker that
answers 200 and then cuts the stream has failed that attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvgate.core.features import RequestFeatures
from kvgate.core.policy import Policy
from kvgate.core.speed import Observation
from kvgate.types import WorkerId


class Judgement(StrEnum):
    """What passive health (outlier detection) learns from an attempt's end."""

    OK = "ok"
    """The worker served it to the end (any status below 500 but 429)."""
    FAULT = "fault"
    """The worker failed it: unreachable, timed out, broke off mid-answer, an error
    answer that was relayed as the request's answer."""
    UNSETTLED = "unsettled"
    """It answered 5xx and the request goes on elsewhere: whose fault it was (the
    worker's or the request's) is for the request's next attempts to say; the
    driver settles it (``fault`` or not) once they have."""
    NONE = "none"
    """It says nothing about the worker: the client went first, the worker said it is
    overloaded (429), or the answer outran the gateway's wait by its length (``DEADLINE``),
    which the client chose: else a client asking for long answers ejects healthy workers."""


DEADLINE = "deadline"
"""The failure of an answer cut off by its length rather than by the worker: a non-streamed
answer (its head comes with all of it) past the first-byte timeout, or any past the total
one. Judged ``NONE``: a client asking for ever longer answers could otherwise eject every
healthy worker in turn (five such requests at once, ``outlier.consecutive_failures``)."""


class EndKind(StrEnum):
    """How an attempt ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


# -- events, for drivers that step the machine with values (tables, the simulator) ---------


@dataclass(frozen=True, slots=True)
class Routed:
    """The policy was told of the placement."""

    at: float


@dataclass(frozen=True, slots=True)
class Ahead:
    """The work queued on a worker ahead of a request, when it was sent."""

    requests: int
    """Other requests the gateway has in flight there."""
    kv_tokens: int
    """The KV tokens those are estimated to hold."""
    waiting: int | None = None
    """The worker's own waiting queue, as last scraped (``None``: unknown)."""


@dataclass(frozen=True, slots=True)
class Sent:
    """The request is written to the worker, with the work queued ahead of it."""

    at: float
    ahead: Ahead | None = None


@dataclass(frozen=True, slots=True)
class Answered:
    """The response's status and headers arrived."""

    at: float
    status: int


@dataclass(frozen=True, slots=True)
class Token:
    """A chunk of the answer arrived."""

    at: float


@dataclass(frozen=True, slots=True)
class Usage:
    """The worker's ``usage``: prompt, cached and completion tokens."""

    prompt: int
    cached: int
    completion: int
    engine_ttft: float | None = None
    """The engine's own time to first token, where it reports one (in its own seconds)."""


@dataclass(frozen=True, slots=True)
class ToolCalled:
    """The answer ended its turn calling a tool."""

    at: float


@dataclass(frozen=True, slots=True)
class Completed:
    """The answer reached its end."""

    at: float


@dataclass(frozen=True, slots=True)
class Failed:
    """The worker failed the attempt: ``kind`` as ``UpstreamError.kind`` (``unavailable``,
    ``timeout``, ``broken``, ``status``...), ``status`` when it answered one."""

    at: float
    kind: str
    status: int | None = None


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The attempt was abandoned (the client went away, or its driver stopped)."""

    at: float


Event = Routed | Sent | Answered | Token | Usage | ToolCalled | Completed | Failed | Cancelled


@dataclass(slots=True)
class AttemptEnd:
    """How one attempt ended, and what it measured: produced once per attempt, and a record
    (nothing changes it once made; not frozen: a frozen class's ``__init__`` costs a
    ``object.__setattr__`` per field, on every request)."""

    worker: WorkerId
    version: str
    kind: EndKind
    judgement: Judgement
    status: int
    """The worker's status (0: none arrived)."""
    failure: str | None
    """The failure's kind (``Failed.kind``), ``None`` unless it failed."""
    routed: bool
    """The policy heard of the placement (so it is owed an end: ``tell_policy``)."""
    placed_at: float
    sent_at: float | None
    ended_at: float
    ahead_requests: int
    """Other requests the gateway had in flight on the worker when this one was sent
    (when it was placed, if it never was)."""
    ahead_kv_tokens: int
    """KV tokens those requests were estimated to hold (the work queued ahead)."""
    ahead_waiting: int | None
    """The worker's own waiting queue at the send, as last scraped (``None``: unknown)."""
    first_token_at: float | None
    last_token_at: float | None
    chunks: int
    """Chunks of the answer that arrived (a whole answer is one)."""
    max_gap_s: float
    """The longest wait between two chunks after the first (0: fewer than two)."""
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    """The worker's ``usage`` (``None``: none was read)."""
    tool_call: bool = False
    """The answer ended its turn calling a tool (as far as its data plane read it)."""
    engine_ttft_s: float | None = None
    """The engine's own time to first token, as its ``usage`` reported it (the emulated
    worker's ``kvgate_timing``, in model seconds; ``None``: not reported)."""

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, from the request being sent (from placement if it never was)."""
        if self.first_token_at is None:
            return None
        return self.first_token_at - (self.sent_at if self.sent_at is not None else self.placed_at)

    @property
    def decode_s(self) -> float | None:
        """Seconds from the first chunk to the last (``None``: no chunk arrived)."""
        if self.first_token_at is None or self.last_token_at is None:
            return None
        return self.last_token_at - self.first_token_at

    @property
    def inter_token_s(self) -> float | None:
        """Mean time between output tokens after the first (``None``: unknown)."""
        decode, tokens = self.decode_s, self.completion_tokens
        if decode is None or tokens is None or tokens < 2 or decode <= 0:
            return None
        return decode / (tokens - 1)


# Module constants: on 3.11 each ``Enum.MEMBER`` is a slow ``EnumType`` lookup, and an
# attempt's end reads several, on every request.
_OK, _FAULT, _UNSETTLED, _NONE = Judgement.OK, Judgement.FAULT, Judgement.UNSETTLED, Judgement.NONE
_COMPLETED, _FAILED, _CANCELLED = EndKind.COMPLETED, EndKind.FAILED, EndKind.CANCELLED


def judge(kind: EndKind, status: int, failure: str | None) -> Judgement:
    """The passive-health judgement of an attempt that ended so (see ``Judgement``)."""
    if kind is _CANCELLED or status == 429:
        return _NONE
    if kind is _COMPLETED:
        return _FAULT if status >= 500 else _OK
    if failure == "status":  # an error answer the request may take elsewhere
        return _UNSETTLED if status >= 500 else _NONE
    if failure == DEADLINE:  # as long as the client asked: no sign of the worker's health
        return _NONE
    return _FAULT  # unreachable, timed out, broken off, not an answer


class AttemptState:
    """The pure state of one attempt; each event method returns the end once, else ``None``.

    Times are the driver's (monotonic live, virtual in the simulator); nothing here
    reads a clock.
    """

    __slots__ = (
        "_end",
        "_first",
        "_last",
        "_max_gap",
        "_routed",
        "_sent",
        "_status",
        "_tool_call",
        "_usage",
        "ahead_kv_tokens",
        "ahead_requests",
        "ahead_waiting",
        "chunks",
        "placed_at",
        "version",
        "worker",
    )

    def __init__(
        self,
        worker: WorkerId,
        version: str,
        placed_at: float,
        *,
        ahead_requests: int = 0,
        ahead_kv_tokens: int = 0,
    ) -> None:
        self.worker = worker
        self.version = version
        self.placed_at = placed_at
        self.ahead_requests = ahead_requests
        self.ahead_kv_tokens = ahead_kv_tokens
        self.ahead_waiting: int | None = None
        self.chunks = 0
        self._routed = False
        self._sent: float | None = None
        self._status = 0
        self._first: float | None = None
        self._last: float | None = None
        self._max_gap = 0.0
        self._usage: Usage | None = None
        self._tool_call = False
        self._end: AttemptEnd | None = None

    @property
    def end(self) -> AttemptEnd | None:
        """The attempt's end, once it has ended."""
        return self._end

    @property
    def ended(self) -> bool:
        """True once the attempt has ended."""
        return self._end is not None

    @property
    def status(self) -> int:
        """The worker's status so far (0: none yet)."""
        return self._status

    @property
    def first_token_at(self) -> float | None:
        """When the first chunk of the answer arrived (``None``: not yet)."""
        return self._first

    @property
    def sent_at(self) -> float | None:
        """When the request was written to the worker (``None``: not yet)."""
        return self._sent

    @property
    def usage_seen(self) -> Usage | None:
        """The usage read so far (``None``: none yet)."""
        return self._usage

    @property
    def is_routed(self) -> bool:
        """True once the policy was told of the placement."""
        return self._routed

    def moved(self, worker: WorkerId, version: str) -> None:
        """The attempt goes to ``worker`` instead: another replica's binding won, or a
        native proxy's fallback served it (the driver tells a routed policy so)."""
        if self._end is not None:
            raise RuntimeError("an attempt that ended cannot move")
        self.worker, self.version = worker, version

    def routed(self, at: float) -> None:
        """The policy was told of the placement: it is owed the attempt's end."""
        if self._end is None:
            self._routed = True

    def sent(
        self,
        at: float,
        ahead_requests: int | None = None,
        ahead_kv_tokens: int = 0,
        ahead_waiting: int | None = None,
    ) -> None:
        """The request is written to the worker, with the work queued before it there
        (``Ahead``'s fields; the first send counts; without ``ahead_requests``, what was
        ahead at placement stands)."""
        if self._sent is None and self._end is None:
            self._sent = at
            if ahead_requests is not None:
                self.ahead_requests = ahead_requests
                self.ahead_kv_tokens = ahead_kv_tokens
                self.ahead_waiting = ahead_waiting

    def answered(self, at: float, status: int) -> None:
        """The response's status arrived."""
        if self._end is None:
            self._status = status

    def token(self, at: float) -> None:
        """A chunk of the answer arrived at ``at``."""
        if self._end is not None:
            return
        last = self._last
        if last is None:
            self._first = at
        elif at - last > self._max_gap:
            self._max_gap = at - last
        self._last = at
        self.chunks += 1

    def usage(
        self, prompt: int, cached: int, completion: int, engine_ttft: float | None = None
    ) -> None:
        """The worker's usage was read (the latest read counts)."""
        if self._end is None:
            self._usage = Usage(prompt, cached, completion, engine_ttft)

    def tool_call(self, at: float) -> None:
        """The answer ended its turn calling a tool."""
        if self._end is None:
            self._tool_call = True

    def completed(self, at: float) -> AttemptEnd | None:
        """The answer reached its end; the attempt's end, or ``None`` if it had ended."""
        return self._finish(at, _COMPLETED, None, None)

    def failed(self, at: float, kind: str, status: int | None = None) -> AttemptEnd | None:
        """The worker failed the attempt; the end, or ``None`` if it had ended."""
        return self._finish(at, _FAILED, kind, status)

    def cancelled(self, at: float) -> AttemptEnd | None:
        """The attempt was abandoned; the end, or ``None`` if it had ended."""
        return self._finish(at, _CANCELLED, None, None)

    def step(self, event: Event) -> AttemptEnd | None:
        """Apply one event (a value); the end when this event ended the attempt."""
        match event:
            case Routed(at):
                self.routed(at)
            case Sent(at, None):
                self.sent(at)
            case Sent(at, Ahead(requests, kv_tokens, waiting)):
                self.sent(at, requests, kv_tokens, waiting)
            case Answered(at, status):
                self.answered(at, status)
            case Token(at):
                self.token(at)
            case Usage(prompt, cached, completion):
                self.usage(prompt, cached, completion)
            case ToolCalled(at):
                self.tool_call(at)
            case Completed(at):
                return self.completed(at)
            case Failed(at, kind, status):
                return self.failed(at, kind, status)
            case Cancelled(at):
                return self.cancelled(at)
        return None

    def _finish(
        self, at: float, kind: EndKind, failure: str | None, status: int | None
    ) -> AttemptEnd | None:
        if self._end is not None:
            return None
        if status is not None:
            self._status = status
        usage = self._usage
        end = self._end = AttemptEnd(
            worker=self.worker,
            version=self.version,
            kind=kind,
            judgement=judge(kind, self._status, failure),
            status=self._status,
            failure=failure,
            routed=self._routed,
            placed_at=self.placed_at,
            sent_at=self._sent,
            ended_at=at,
            ahead_requests=self.ahead_requests,
            ahead_kv_tokens=self.ahead_kv_tokens,
            ahead_waiting=self.ahead_waiting,
            first_token_at=self._first,
            last_token_at=self._last,
            chunks=self.chunks,
            max_gap_s=self._max_gap,
            prompt_tokens=usage.prompt if usage is not None else None,
            cached_tokens=usage.cached if usage is not None else None,
            completion_tokens=usage.completion if usage is not None else None,
            tool_call=self._tool_call,
            engine_ttft_s=usage.engine_ttft if usage is not None else None,
        )
        return end


def tell_policy(policy: Policy, features: RequestFeatures, end: AttemptEnd, now: float) -> None:
    """The policy's side of an attempt's end: its usage (cache feedback) and what was
    measured of it (``on_observed``: TTFT from the send, token times), or, with no usage,
    that nothing more is owed on that worker. Nothing when the policy never heard of it."""
    if not end.routed:
        return
    if end.prompt_tokens is None:
        policy.on_dropped(features, end.worker, now)
        return
    policy.on_usage(
        features,
        end.worker,
        end.prompt_tokens,
        end.cached_tokens or 0,
        now,
        completion_tokens=end.completion_tokens or 0,
    )
    observed = Observation(
        end.ttft_s,
        end.prompt_tokens,
        end.cached_tokens or 0,
        end.completion_tokens or 0,
        end.inter_token_s,
        end.engine_ttft_s,
    )
    policy.on_observed(features, end.worker, observed, now)
