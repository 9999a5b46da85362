"""Forwarding one OpenAI request to a worker: retries, streaming pass-through, usage.

A request is retried on another worker only before its first byte went to the
client: on a connection failure, or a 5xx/429 answer, within the retry budget.
Streams are written to the client chunk by chunk as they arrive; the ``usage``
of the final event is read from a bounded tail after the stream has ended. With
``stream_usage`` (the default) the worker is asked for usage on every stream, so
the policy gets its cache feedback; a client that did not ask for it does not
see it (``usage.UsageStripper``).
A client that goes away cancels the upstream request (the connection is
dropped), so the worker stops generating.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import xxhash
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from multidict import CIMultiDict

from kvgate.core import prefix
from kvgate.core.features import RequestFeatures
from kvgate.core.prefix import Endpoint, FeatureConfig
from kvgate.gateway.control.offload import TIER_HEADER, SlotPlane
from kvgate.gateway.control.outcomes import OutcomeRecorder
from kvgate.gateway.dataplane.errors import (
    BadGatewayError,
    BodyTooLargeError,
    DrainingError,
    GatewayError,
    GatewayTimeoutError,
    InvalidRequestError,
    NoHealthyWorkerError,
    OverloadedError,
    UpstreamBroken,
    UpstreamError,
    UpstreamTimeout,
)
from kvgate.gateway.dataplane.middleware import REQUEST_ID_KEY
from kvgate.gateway.dataplane.models import unknown_model_error
from kvgate.gateway.dataplane.retry import RetryBudget
from kvgate.gateway.dataplane.router import Placement, Router
from kvgate.gateway.dataplane.usage import (
    StreamTap,
    Usage,
    UsageStripper,
    client_wants_stream_usage,
    usage_from_body,
    with_stream_usage,
)
from kvgate.gateway.observe.logs import AccessLog, AccessRecord
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.observe.traffic import TrafficWindow
from kvgate.gateway.upstream.transport import UpstreamResponse

log = logging.getLogger("kvgate.gateway.dataplane.proxy")

REQUEST_ID = "X-Request-ID"
WORKER_HEADER = "X-Kvgate-Worker"
VERSION_HEADER = "X-Kvgate-Model-Version"
REASON_HEADER = "X-Kvgate-Route-Reason"

# RFC 9110 hop-by-hop headers, plus those the client library sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "x-request-id",
    }
)


_NOT_FORWARDED = _HOP_BY_HOP | {"content-encoding"}
"""Request headers not passed to the worker: the server already decoded the body (gzip,
deflate), so the bytes forwarded are not in the encoding the client named."""


def _reason(exc: BaseException) -> str:
    """The first line of an exception's text, bounded (parser messages quote input)."""
    text = str(getattr(exc, "message", "") or exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


_PUBLIC_KIND = {
    "unavailable": "the worker could not be reached",
    "timeout": "the worker did not answer in time",
    "broken": "the worker's response broke off",
}


def _public(exc: UpstreamError) -> str:
    """What a client may read of an upstream failure: its kind, never the worker's
    address, bytes or exception text (those are in the gateway's log and metrics)."""
    if exc.status is not None:
        return f"the worker answered {exc.status}"
    return _PUBLIC_KIND.get(exc.kind, "the worker failed")


_ANSWER_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')


@dataclass(frozen=True, slots=True)
class Forward:
    """How to forward a request that is not a generation: its features and body."""

    features: RequestFeatures
    body: bytes
    method: str = "POST"
    answer_key: str | None = None
    """Tag under which the answer's id is bound to its worker (``None``: not bound)."""


Describe = Callable[[bytes, web.Request, str], Forward]
"""Builds a ``Forward`` from the body, the request and its id (raises ``GatewayError``)."""


class PassiveHealth(Protocol):
    """Where live request outcomes go (outlier detection)."""

    def success(self, worker: Worker) -> None:
        """A request on ``worker`` got a non-error answer."""

    def failure(self, worker: Worker) -> None:
        """A request on ``worker`` failed (unreachable, 5xx, broken)."""


@dataclass(slots=True)
class _Outcome:
    """What one request's answer was, for metrics and the access log."""

    status: int = 0
    placement: Placement | None = None
    ttft: float | None = None
    usage: Usage | None = None
    retries: int = 0
    budgeted: int = 0
    strip_usage: bool = False
    """The gateway asked the worker for stream usage the client did not ask for."""
    reported: bool = False
    """The current placement's failure already went to the outcome recorder."""
    body: bytes = b""
    sample: bytes | None = None
    """The response body, kept only when it was sampled for the quality evaluator."""
    method: str = "POST"
    answer_key: str | None = None
    """Bind the id the answer starts with under this tag (``response:``), for continuations."""
    shed: str | None = None
    """Why the request was shed (429), for the access log and the dashboard."""
    refused: str | None = None
    """The shed reason or error code of a request the gateway answered itself."""
    last_chunk: float | None = None
    """When a stream's last chunk arrived (seconds after the start): inter-token latency."""
    asked_model: str = ""
    """The model a refused request named when no worker serves it (access log only)."""


class _StreamResponse(web.StreamResponse):
    """A stream whose head goes out with its first chunk (one write, not two).

    ``_stream`` writes the head alone at once when no chunk is waiting, so a
    client still sees the head as soon as the worker's arrived.
    """

    _send_headers_immediately = False


class _RequestIds:
    """Request ids of 32 hex digits, as a UUID's: a random stem per gateway and a counter.

    Cheaper than ``uuid4()`` per request (no system call); the stem keeps the ids
    of different gateway processes apart.
    """

    __slots__ = ("_next", "_stem")

    def __init__(self) -> None:
        self._stem = os.urandom(8).hex()
        self._next = itertools.count().__next__

    def __call__(self) -> str:
        return f"{self._stem}{self._next():016x}"


class Proxy:
    """Handles ``/v1/chat/completions`` and ``/v1/completions`` end to end."""

    def __init__(
        self,
        pool: WorkerPool,
        router: Router,
        *,
        budget: RetryBudget,
        metrics: GatewayMetrics,
        passive: PassiveHealth,
        access_log: AccessLog,
        features: FeatureConfig,
        max_retries: int,
        response_headers: bool,
        strip_client_auth: bool,
        draining: Callable[[], bool],
        rng: random.Random,
        stream_usage: bool = True,
        outcomes: OutcomeRecorder | None = None,
        expose_worker_urls: bool = False,
        aliases: Mapping[str, str] | None = None,
        slots: SlotPlane | None = None,
        traffic: TrafficWindow | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self.aliases: Mapping[str, str] = aliases or {}
        """Model names clients may use for another model (``model_aliases``)."""
        self.router = router
        self.budget = budget
        self.metrics = metrics
        self.passive = passive
        self.access_log = access_log
        self.features = features
        self.max_retries = max_retries
        self.response_headers = response_headers
        self.strip_client_auth = strip_client_auth
        self.draining = draining
        self.rng = rng
        self.stream_usage = stream_usage
        self.outcomes = outcomes
        self.expose_worker_urls = expose_worker_urls
        self._names: dict[str, str] = {}
        self.slots = slots
        self.traffic = traffic
        """The dashboard's ring of recent traffic (``None``: not kept)."""
        self.wall = wall
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._new_id = _RequestIds()

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``."""
        return await self.handle(request, "/v1/chat/completions", "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions``."""
        return await self.handle(request, "/v1/completions", "completions")

    async def handle(
        self,
        request: web.Request,
        path: str,
        endpoint: Endpoint,
        *,
        describe: Describe | None = None,
    ) -> web.StreamResponse:
        """Parse, route, forward (with retries) and answer one request.

        ``describe`` builds the features of a request that is not a generation
        (embeddings, responses, tokenize, any other path); it may rewrite the body.
        """
        started = time.monotonic()
        request_id = request.headers.get(REQUEST_ID) or self._new_id()
        request[REQUEST_ID_KEY] = request_id
        if self.draining():
            raise DrainingError("the gateway is shutting down")
        self.in_flight += 1
        self.idle.clear()
        outcome = _Outcome()
        features: RequestFeatures | None = None
        try:
            body = await self._read_body(request)
            if describe is not None:
                forward = describe(body, request, request_id)
                features, body = forward.features, forward.body
                outcome.method = forward.method
                outcome.answer_key = forward.answer_key
                outcome.body = body
                return await self._forward(
                    request, path, body=body, features=features, started=started, outcome=outcome
                )
            features, payload, body = self._features(body, request, request_id, endpoint)
            if not self.pool.serves(features.model):
                # The access log says what was asked; metric labels never carry a
                # client's made-up model name (one series per name, forever).
                outcome.asked_model, features = features.model, None
                raise unknown_model_error(self.pool, outcome.asked_model)  # 404, or 503
            if self.slots is not None:
                features = self.slots.annotate(features)  # KV that can follow the session
            if self.stream_usage and features.stream and not client_wants_stream_usage(payload):
                # Ask for usage anyway: it is the policy's only cache feedback on streams.
                body = with_stream_usage(body, payload)
                outcome.strip_usage = True
            outcome.body = body
            return await self._forward(
                request, path, body=body, features=features, started=started, outcome=outcome
            )
        except GatewayError as exc:
            outcome.status = exc.status
            if isinstance(exc, OverloadedError):
                outcome.shed = exc.reason
            outcome.refused = outcome.shed or exc.code
            raise
        except asyncio.CancelledError:
            outcome.status = 499
            if features is not None:
                self.metrics.client_disconnects.labels(features.model).inc()
            raise
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self.idle.set()
            self._record(features, outcome, started, request_id, path)

    async def _read_body(self, request: web.Request) -> bytes:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise BodyTooLargeError(
                f"request body is larger than the limit of {request.app._client_max_size} bytes"
            ) from exc
        except (HttpProcessingError, RequestPayloadError) as exc:
            # Bad chunked framing, a body that is not what its Content-Encoding says...
            raise InvalidRequestError(f"the request body cannot be read: {_reason(exc)}") from None

    def _features(
        self, body: bytes, request: web.Request, request_id: str, endpoint: Endpoint
    ) -> tuple[RequestFeatures, dict[str, Any], bytes]:
        """The request's features, decoded body and the body to forward (an alias
        resolved to its model); 400/404 errors on a bad one."""
        try:
            payload = json.loads(body)
        except ValueError:
            raise InvalidRequestError("the request body is not valid JSON") from None
        except RecursionError:
            raise InvalidRequestError("the request body's JSON is nested too deeply") from None
        if self.aliases and isinstance(payload, dict):
            target = self.aliases.get(payload.get("model"))  # type: ignore[arg-type]
            if target is not None:
                payload["model"] = target
                body = json.dumps(payload, separators=(",", ":")).encode()
        try:
            features = prefix.build_features(
                payload, request.headers, self.features, request_id=request_id, endpoint=endpoint
            )
        except prefix.InvalidRequest as exc:
            raise InvalidRequestError(exc.message, param=exc.param) from None
        except UnicodeEncodeError:
            # JSON's "\ud800" decodes to a lone surrogate, which no text encoding takes.
            raise InvalidRequestError(
                "the request holds a lone surrogate: not valid Unicode text"
            ) from None
        except RecursionError:
            raise InvalidRequestError("the request is nested too deeply") from None
        return features, payload, body

    async def _forward(
        self,
        request: web.Request,
        path: str,
        *,
        body: bytes,
        features: RequestFeatures,
        started: float,
        outcome: _Outcome,
    ) -> web.StreamResponse:
        affinity = await self.router.lookup(features)
        budget = self.budget
        budget.requests += 1
        excluded: frozenset[str] = frozenset()
        last_failure: UpstreamError | None = None
        # Error answers (5xx) not charged yet: one that another worker then serves was
        # the worker's fault; the same error from the next worker follows the request.
        unsettled: list[tuple[Worker, str, int]] = []
        # Before the first byte, a request that failed on a canary version may be
        # served by the stable one (else a failing canary's sessions only ever fail).
        forced: str | None = None
        stable = self.router.stable_version(features.model)
        try:
            while True:
                try:
                    placement = await self.router.place(features, affinity, excluded, forced)
                except NoHealthyWorkerError:
                    if outcome.retries and last_failure is not None:
                        tried = outcome.placement.version if outcome.placement else stable
                        if forced is None and stable is not None and tried != stable:
                            forced = stable  # no other canary worker: the stable one
                            continue
                        self._charge(unsettled, features)
                        raise self._client_error(last_failure, features) from None
                    raise
                async with placement.lease:
                    outcome.placement = placement
                    outcome.reported = False
                    worker = placement.worker
                    try:
                        headers = self._upstream_headers(request, worker, features.request_id)
                        if (
                            self.slots is not None
                            and outcome.method == "POST"
                            and self.slots.manages(worker)
                        ):
                            # A llama.cpp worker: a slot lease (offload/restore/migration).
                            upstream = await self.slots.post(
                                worker, path, body, headers, features.affinity_key
                            )
                            # The reason says which tier the KV came from: slot, disk, ...
                            if tier := upstream.headers.get(TIER_HEADER):
                                placement.reason = f"{placement.reason}/{tier}"
                        else:
                            upstream = await worker.upstream.send(
                                outcome.method, path, body, headers
                            )
                        if upstream.status == 429 or upstream.status >= 500:
                            await self._drain_error(upstream)
                            raise UpstreamError(status=upstream.status)
                    except UpstreamError as exc:
                        placement.lease.release()  # free the slot before the backoff
                        last_failure = exc
                        if exc.status is not None and exc.status != 429:
                            same = any(status == exc.status for _, _, status in unsettled)
                            on_canary = stable is not None and placement.version != stable
                            if same and on_canary and forced is None:
                                forced = stable  # the canary may be at fault: ask the stable one
                            elif same:
                                # Two workers gave this request the same error: it is the
                                # request's doing. Neither worker is charged, nor retried.
                                self.metrics.upstream_errors.labels(worker.id, exc.kind).inc()
                                unsettled.clear()
                                outcome.reported = True  # says nothing about the version
                                raise self._request_fault(exc.status, outcome.retries + 1) from None
                        if not self._retry(exc, placement, features, outcome, unsettled):
                            self._charge(unsettled, features)
                            raise self._client_error(exc, features) from None
                        excluded = excluded | {worker.id}
                        if placement.bound is not None:
                            affinity = placement.bound  # what this attempt bound; a retry moves it
                        await asyncio.sleep(budget.backoff(outcome.retries, self.rng))
                        continue
                    # Another worker served what these failed: that was the workers' fault.
                    self._charge(unsettled, features)
                    if upstream.status < 500:
                        self.passive.success(worker)
                    return await self._respond(
                        request,
                        features=features,
                        placement=placement,
                        upstream=upstream,
                        started=started,
                        outcome=outcome,
                    )
        finally:
            budget.requests -= 1
            budget.give_back(outcome.budgeted)

    def _retry(
        self,
        exc: UpstreamError,
        placement: Placement,
        features: RequestFeatures,
        outcome: _Outcome,
        unsettled: list[tuple[Worker, str, int]],
    ) -> bool:
        """Count one failed attempt; True when the request may be retried on another worker.

        A connection failure is charged to the worker at once; a 5xx waits in
        ``unsettled`` until another worker's answer says whose fault it was.
        """
        worker = placement.worker
        self.metrics.upstream_errors.labels(worker.id, exc.kind).inc()
        if exc.status is None:
            self._charge([(worker, placement.version, 0)], features)
            outcome.reported = True
        elif exc.status != 429:
            unsettled.append((worker, placement.version, exc.status))
            outcome.reported = True
        if not exc.retryable or outcome.retries >= self.max_retries:
            return False
        if exc.status is not None:
            # A worker that answered 5xx/429 may be overloaded: its retries spend the
            # budget. A connection failure did no work anywhere, so re-picking it adds
            # no load and is only bounded by count.
            if not self.budget.allow():
                self.metrics.retries_denied.labels(features.model).inc()
                return False
            outcome.budgeted += 1
        outcome.retries += 1
        self.metrics.retries.labels(features.model).inc()
        return True

    def _charge(self, failed: list[tuple[Worker, str, int]], features: RequestFeatures) -> None:
        """Count failed attempts against their workers (outlier detection) and versions."""
        for worker, version, _ in failed:
            self.passive.failure(worker)
            if self.outcomes is not None:
                self.outcomes.attempt_failed(features.model, version)
        failed.clear()

    def _request_fault(self, status: int, attempts: int) -> GatewayError:
        return BadGatewayError(
            f"{attempts} workers answered this request with the same error ({status}): "
            "the request itself is the likely cause; it was not retried further"
        )

    async def _drain_error(self, upstream: UpstreamResponse) -> None:
        # Read the small error body so the connection can be reused.
        try:
            await upstream.read()
        except UpstreamError:
            upstream.close()

    def _client_error(self, exc: UpstreamError, features: RequestFeatures) -> GatewayError:
        if isinstance(exc, UpstreamTimeout):
            return GatewayTimeoutError(
                f"the worker serving {features.model!r} did not answer in time"
            )
        if exc.status == 429:
            self.metrics.sheds.labels("upstream_429", features.priority.name.lower()).inc()
            return OverloadedError(
                "every worker tried is overloaded; retry later",
                retry_after=1.0,
                reason="upstream_429",
            )
        return BadGatewayError(f"upstream failure serving {features.model!r}: {_public(exc)}")

    def _upstream_headers(
        self, request: web.Request, worker: Worker, request_id: str
    ) -> dict[str, str]:
        headers: dict[str, str] = {}
        connection = request.headers.get("Connection")
        drop = _NOT_FORWARDED
        if connection:
            drop = drop | {t.strip().lower() for t in connection.split(",")}
        for name, value in request.headers.items():
            if name.lower() not in drop:
                headers[name] = value
        headers[REQUEST_ID] = request_id
        api_key = worker.config.api_key
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        elif self.strip_client_auth:
            headers.pop("Authorization", None)
            headers.pop("authorization", None)
        return headers

    def _worker_name(self, worker: Worker) -> str:
        """The worker as clients see it: an id, its URL only with ``expose_worker_urls``."""
        if self.expose_worker_urls:
            return worker.id
        name = self._names.get(worker.id)
        if name is None:
            name = self._names[worker.id] = public_worker_name(worker.id, worker.config.name)
        return name

    def _response_headers(
        self, upstream: UpstreamResponse, placement: Placement, request_id: str
    ) -> CIMultiDict[str]:
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in upstream.headers.items():
            if name.lower() not in _HOP_BY_HOP:
                headers.add(name, value)
        headers[REQUEST_ID] = request_id
        if self.response_headers:
            headers[WORKER_HEADER] = self._worker_name(placement.worker)
            headers[VERSION_HEADER] = placement.version
            headers[REASON_HEADER] = placement.reason
        return headers

    async def _respond(
        self,
        request: web.Request,
        *,
        features: RequestFeatures,
        placement: Placement,
        upstream: UpstreamResponse,
        started: float,
        outcome: _Outcome,
    ) -> web.StreamResponse:
        worker = placement.worker
        headers = self._response_headers(upstream, placement, features.request_id)
        done = False
        try:
            if upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
                response, done = await self._stream(request, upstream, headers, started, outcome)
            else:
                data = await upstream.read()
                if upstream.status < 300 and not _looks_like_json_object(data):
                    # An empty or non-JSON 2xx is no OpenAI answer: the worker's failure.
                    raise UpstreamBroken("the worker's 2xx answer is not a JSON object")
                outcome.ttft = time.monotonic() - started
                response = web.Response(body=data, status=upstream.status, headers=headers)
                outcome.status = upstream.status
                await response.prepare(request)
                await response.write_eof()
                outcome.usage = usage_from_body(data)
                done = True
                if outcome.answer_key is not None:
                    await self._remember_answer(data, placement, outcome.answer_key)
                recorder = self.outcomes
                version = placement.version
                if recorder is not None and recorder.wants_sample(features.model, version):
                    outcome.sample = data
        except UpstreamError as exc:
            # The whole-body read failed before anything was sent: a 502.
            self.metrics.upstream_errors.labels(worker.id, exc.kind).inc()
            self.passive.failure(worker)
            raise BadGatewayError(
                f"upstream failure serving {features.model!r}: {_public(exc)}"
            ) from None
        except ConnectionResetError:
            self._client_gone(features.model, outcome)
            return web.Response(status=499)
        finally:
            if not done:
                upstream.close()
            placement.lease.release()  # before the feedback below: waiters need not wait on it
        if done:
            usage = outcome.usage
            await self.router.finished(
                features,
                placement,
                usage.prompt if usage is not None else None,
                usage.cached if usage is not None else None,
            )
        return response

    async def _stream(
        self,
        request: web.Request,
        upstream: UpstreamResponse,
        headers: CIMultiDict[str],
        started: float,
        outcome: _Outcome,
    ) -> tuple[web.StreamResponse, bool]:
        """Pass an SSE stream through; True when it ran to its end."""
        response = _StreamResponse(status=upstream.status, headers=headers)
        outcome.status = upstream.status
        await response.prepare(request)
        if not upstream.ready:
            await response.write(b"")  # no first chunk to carry the head yet: send it alone
        tap = StreamTap()
        stripper = UsageStripper() if outcome.strip_usage else None
        try:
            async for chunk in upstream.chunks():
                if outcome.ttft is None:
                    outcome.ttft = time.monotonic() - started
                    if outcome.answer_key is not None:
                        await self._remember_answer(chunk, outcome.placement, outcome.answer_key)
                outcome.last_chunk = time.monotonic() - started
                data = stripper.feed(chunk) if stripper is not None else chunk
                if not data:
                    continue
                await response.write(data)
                tap.feed(data)
            if stripper is not None and (rest := stripper.flush()):
                await response.write(rest)
            await response.write_eof()
        except UpstreamError as exc:
            # Bytes already went to the client: no retry. End the stream with an
            # OpenAI-style error event (what clients raise on), then close.
            assert outcome.placement is not None
            self.metrics.upstream_errors.labels(outcome.placement.worker.id, exc.kind).inc()
            self.passive.failure(outcome.placement.worker)
            outcome.status = 502
            event = b"" if tap.at_event_boundary else b"\n\n"
            event += (
                b"data: "
                + BadGatewayError(
                    f"the stream broke off: {_public(exc)}", code="stream_broken"
                ).body()
                + b"\n\n"
            )
            try:
                await response.write(event)
                await response.write_eof()
            except (ConnectionResetError, RuntimeError):
                pass
            if request.transport is not None:
                request.transport.close()
            return response, False
        except ConnectionResetError:
            # The client went away mid-stream; dropping the upstream tells the worker.
            assert outcome.placement is not None
            self._client_gone(outcome.placement.worker.model or "", outcome)
            return response, False
        outcome.usage = stripper.usage if stripper is not None else tap.usage()
        return response, True

    async def _remember_answer(self, data: bytes, placement: Placement | None, tag: str) -> None:
        """Bind the answer's own id (the first ``"id"`` in its head) to its worker."""
        found = _ANSWER_ID.search(data, 0, 4096)
        if found is not None and placement is not None:
            await self.router.remember(tag + found.group(1).decode(), placement)

    def _client_gone(self, model: str, outcome: _Outcome) -> None:
        outcome.status = 499
        self.metrics.client_disconnects.labels(model).inc()

    def _record(
        self,
        features: RequestFeatures | None,
        outcome: _Outcome,
        started: float,
        request_id: str,
        path: str = "",
    ) -> None:
        duration = time.monotonic() - started
        model = features.model if features is not None else ""
        placement = outcome.placement
        worker = placement.worker.id if placement is not None else ""
        version = placement.version if placement is not None else ""
        reason = placement.reason if placement is not None else (outcome.refused or "error")
        status = outcome.status or 500
        usage = outcome.usage
        m = self.metrics
        m.child(m.requests, model, version, worker, str(status), reason).inc()
        if features is not None and placement is not None:
            m.child(m.request_duration, model, version, worker).observe(duration)
            if outcome.ttft is not None:
                m.child(m.ttft, model, version, worker).observe(outcome.ttft)
                itl = _inter_token(outcome, usage)
                if itl is not None:
                    m.child(m.inter_token_latency, model, version, worker).observe(itl)
            if usage is not None:
                m.child(m.prompt_tokens, model, worker).inc(usage.prompt)
                m.child(m.cached_tokens, model, worker).inc(usage.cached)
                m.child(m.completion_tokens, model, worker).inc(usage.completion)
        if self.outcomes is not None and features is not None and placement is not None:
            _report(self.outcomes, features.model, placement.version, outcome, duration)
        if self.traffic is not None:
            self.traffic.record(
                self.wall(),
                status=status,
                worker=worker,
                reason=reason if placement is not None else None,
                prompt_tokens=usage.prompt if usage is not None else 0,
                cached_tokens=usage.cached if usage is not None else 0,
                retries=outcome.retries,
                shed_reason=outcome.shed,
            )
        if self.access_log.enabled:
            self.access_log.write(
                AccessRecord(
                    request_id=request_id,
                    model=model or outcome.asked_model,
                    worker=worker,
                    version=version,
                    reason=reason,
                    status=status,
                    ttft=outcome.ttft,
                    duration=duration,
                    retries=outcome.retries,
                    path=path,
                    session=features.session_source.value if features is not None else "none",
                    stream=features.stream if features is not None else False,
                    prompt_tokens=usage.prompt if usage is not None else None,
                    cached_tokens=usage.cached if usage is not None else None,
                    completion_tokens=usage.completion if usage is not None else None,
                )
            )


def _inter_token(outcome: _Outcome, usage: Usage | None) -> float | None:
    """A stream's mean time between output tokens after the first (``None``: not a stream)."""
    if outcome.last_chunk is None or outcome.ttft is None or usage is None:
        return None
    if usage.completion < 2 or outcome.last_chunk <= outcome.ttft:
        return None
    return (outcome.last_chunk - outcome.ttft) / (usage.completion - 1)


def _report(
    recorder: OutcomeRecorder, model: str, version: str, outcome: _Outcome, duration: float
) -> None:
    """One request's outcome for its version's windows (a failed last attempt is already in)."""
    status = outcome.status or 500
    if outcome.reported or status == 499:
        return  # a client that went away says nothing about the version
    error = status >= 500
    ok = status < 400
    recorder.finished(
        model,
        version,
        error=error,
        latency_s=duration if ok else None,
        ttft_s=outcome.ttft if ok else None,
    )
    if outcome.sample is not None and ok:
        recorder.sample(model, version, outcome.body, outcome.sample)


def public_worker_name(url: str, name: str | None = None) -> str:
    """A worker's name for clients: its configured ``name``, else ``w-`` and a hash of its
    URL (stable across gateway replicas and restarts, and no internal address)."""
    return name or "w-" + xxhash.xxh3_64_hexdigest(url.encode())[:12]


def _looks_like_json_object(data: bytes) -> bool:
    """True when ``data`` is framed as a JSON object (a cheap check: no decoding)."""
    return data.lstrip()[:1] == b"{" and data.rstrip()[-1:] == b"}"
