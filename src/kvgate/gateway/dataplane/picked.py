"""One request the endpoint picker placed, from its decision to its end.

A native proxy (Envoy) moves the bytes; the picker only hears of them, as ext_proc
messages. ``extproc`` translates the messages, this object translates what they
say (the endpoint that served, the response's status, its body chunks carrying
``usage``, the end, or the stream breaking off) into the events of the request's
``Attempt`` (``dataplane.attempt``), the one owner that releases the lease, tells
the policy, updates passive health and records the version's outcome, once, on
every path, exactly as it does for the built-in proxy. The request's own record
(metrics, access log) is the relay's ``record``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvgate.core.features import RequestFeatures
from kvgate.gateway.dataplane.attempt import Attempt, PassiveHealth
from kvgate.gateway.dataplane.relay import Outcome, Relay, answer_id
from kvgate.gateway.dataplane.usage import (
    MessagesTap,
    StreamTap,
    Usage,
    UsageStripper,
    ends_in_tool_call,
    opening_only,
    usage_from_body,
)
from kvgate.gateway.observe.pool import Worker

_BODY_KEEP = 1 << 20
"""A JSON answer's bytes kept to read its ``usage`` (larger ones: the tail only)."""


class PickedRequest:
    """The events of one placed request, handed to its ``Attempt`` (which ends once)."""

    __slots__ = (
        "_body",
        "_recorded",
        "_stream",
        "_stripper",
        "_tap",
        "attempt",
        "features",
        "outcome",
        "passive",
        "path",
        "relay",
        "request_id",
        "started",
    )

    def __init__(
        self,
        relay: Relay,
        passive: PassiveHealth,
        features: RequestFeatures,
        attempt: Attempt,
        *,
        started: float,
        path: str,
        request_id: str = "",
    ) -> None:
        self.relay = relay
        self.passive = passive
        self.features = features
        self.attempt = attempt
        self.started = started
        self.path = path
        self.request_id = request_id  # the client's, for the log (``features``': the picker's)
        self.outcome = Outcome(attempt=attempt, request_id=request_id)
        self._recorded = False
        self._stream = False
        self._tap: StreamTap | None = None
        self._stripper: UsageStripper | None = None
        self._body = bytearray()

    @property
    def ended(self) -> bool:
        """True once the request's end (or its breaking off) was recorded."""
        return self._recorded

    def sent(self) -> None:
        """The decision went back to the proxy: the request is on its way to its worker."""
        self.attempt.sent()

    async def served(self, worker: Worker | None, skipped: Sequence[Worker]) -> None:
        """The proxy says which endpoint served (``None``: it did not say).

        The endpoints of the fallback list before the one that served were tried
        and failed (the proxy goes down the list in order): each counts as a
        failure for outlier detection and for its version. The attempt follows the serving worker
        (``Attempt.serve_on``: its lease, the policy's books and the session's
        binding), so the one doing the work is the one counted and charged.
        """
        outcomes = self.attempt.parts.outcomes
        for failed in skipped:
            # As the built-in proxy charges an attempt another worker then served: the
            # worker (outlier detection) and its version (the rollout's error gate).
            self.passive.failure(failed)
            if outcomes is not None:
                outcomes.attempt_failed(self.features.model, failed.version)
        if worker is not None and worker is not self.attempt.worker:
            await self.attempt.serve_on(worker, "fallback")

    def strip_usage(self) -> None:
        """The picker asked the worker for the stream's usage the client did not ask for:
        take it out of the answer again (``relayed``), as the built-in proxy does."""
        self._stripper = UsageStripper()

    def relayed(self, data: bytes, last: bool) -> bytes:
        """The bytes of a response chunk to send on to the client (full-duplex mode)."""
        stripper = self._stripper
        if stripper is None or not self._stream:
            return data
        out = stripper.feed(data)
        return out + stripper.flush() if last else out

    def response_head(self, status: int, content_type: str) -> None:
        """The worker's response headers arrived (through the proxy)."""
        self.outcome.status = status
        self.attempt.answered(status)
        self._stream = content_type.startswith("text/event-stream")
        if self._stream:
            self._tap = MessagesTap() if self.path == "/v1/messages" else StreamTap()

    def response_chunk(self, data: bytes) -> None:
        """A piece of the response body; the first one is the time to first token."""
        if not data:
            return
        now = time.monotonic()
        outcome = self.outcome
        if outcome.ttft is not None:
            self.attempt.token(now)
        elif not (self._stream and opening_only(data)):  # the first token, not the opening
            self.attempt.token(now)
            outcome.ttft = now - self.started
        if self._stream:
            outcome.last_chunk = now - self.started
            assert self._tap is not None
            self._tap.feed(data)
        else:
            body = self._body
            body += data
            if len(body) > _BODY_KEEP:
                del body[: -_BODY_KEEP // 2]

    async def remember_answer(self, data: bytes) -> None:
        """Bind the id a ``/v1/responses`` answer opens with to the worker that made it
        (under its creator's scope: ``Outcome.answer_key``), once, on its first chunk."""
        key_of, outcome = self.outcome.answer_key, self.outcome
        if key_of is None or not data or outcome.status >= 300:
            return
        outcome.answer_key = None
        found = answer_id(data)
        if found is not None and (key := key_of(found)) is not None:
            await self.attempt.remember(key)

    async def response_end(self) -> None:
        """The response ended (its last body chunk, its trailers or a header-only answer):
        the attempt completed (judged by its status). The record is made before the one
        await (the binding's TTL renewed), so a cancellation there loses nothing."""
        if self._recorded:
            return
        outcome = self.outcome
        if outcome.ttft is None:
            outcome.ttft = time.monotonic() - self.started
        usage = outcome.usage = self._usage()
        outcome.answered = outcome.status < 400
        if usage is not None:
            self.attempt.usage(usage.prompt, usage.cached, usage.completion, usage.engine_ttft)
        self._tool_call()
        self.attempt.completed()
        self._record()
        if outcome.forget is not None and outcome.status < 300:
            await self.attempt.forget(outcome.forget)  # a stored response its worker deleted
        if usage is not None:
            await self.attempt.refresh()

    def broken(self, status: int = 499) -> None:
        """The stream ended before the response did: the client or the proxy went away."""
        if self._recorded:
            return
        outcome = self.outcome
        usage = outcome.usage = self._usage()
        if usage is None:
            outcome.status = status
            self.relay.metrics.client_disconnects.labels(self.features.model).inc()
        else:
            self.attempt.usage(usage.prompt, usage.cached, usage.completion, usage.engine_ttft)
        self._tool_call()
        self.attempt.cancelled()
        self._record()

    def _tool_call(self) -> None:
        """Tell the attempt when the answer ended its turn calling a tool: its end books the
        session away (``core.toolcalls.leaves_away``), as on the built-in proxy."""
        if self.outcome.status >= 300:
            return
        if self._tap is not None:  # a stream: every chunk went through the tap
            called = self._tap.tool_call()
        else:
            called = ends_in_tool_call(bytes(self._body))
        if called:
            self.attempt.tool_call()

    def _usage(self) -> Usage | None:
        if self._stripper is not None and self._stream and self._stripper.usage is not None:
            return self._stripper.usage
        if self._tap is not None:
            return self._tap.usage()
        if self._body and self.outcome.status < 300:
            return usage_from_body(bytes(self._body))
        return None

    def _record(self) -> None:
        """Record the request (metrics, access log): once."""
        self._recorded = True
        self.relay.record(self.features, self.outcome, self.started, self.request_id, self.path)
