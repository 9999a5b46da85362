"""Forwarding one OpenAI request to a worker: retries, streaming pass-through, usage.

A request is retried on another worker only before its first byte went to the
client: on a connection failure, or a 5xx/429 answer, within the retry budget.
Streams are written to the client chunk by chunk as they arrive; the ``usage``
of the final event is read from a bounded tail after the stream has ended. With
``stream_usage`` (the default) the worker is asked for usage on every stream, so
the policy gets its cache feedback; a client that did not ask for it does not
see it (``usage.UsageStripper``).
A client that goes away cancels the upstream request (the connection is
dropped), so the worker stops generating. The answer is written out, and the
request's outcome recorded, by ``relay.Relay``. Each attempt is an ``Attempt``
(``dataplane.attempt``) the router's ``place`` returns: the proxy and the relay
report its events and it ends once (lease, policy, passive health, outcome); neither
calls back into the router.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from aiohttp import web

from kvgate.core import prefix
from kvgate.core.features import RequestFeatures
from kvgate.core.outlier import Blame, blame
from kvgate.core.prefix import Endpoint, FeatureConfig
from kvgate.gateway.apikeys import KeyNames
from kvgate.gateway.control.offload import TIER_HEADER, SlotPlane
from kvgate.gateway.control.outcomes import OutcomeRecorder
from kvgate.gateway.dataplane.attempt import Attempt, Looked, Placer
from kvgate.gateway.dataplane.errors import (
    BadGatewayError,
    DrainingError,
    GatewayError,
    GatewayTimeoutError,
    InvalidRequestError,
    NoHealthyWorkerError,
    OverloadedError,
    UpstreamError,
    UpstreamTimeout,
)
from kvgate.gateway.dataplane.exchange import AiohttpExchange, Exchange
from kvgate.gateway.dataplane.models import unknown_model_error
from kvgate.gateway.dataplane.relay import (
    HOP_BY_HOP,
    REQUEST_ID,
    AwaySessions,
    Outcome,
    Relay,
    public_failure,
)
from kvgate.gateway.dataplane.retry import RetryBudget
from kvgate.gateway.dataplane.usage import client_wants_stream_usage, with_stream_usage
from kvgate.gateway.dataplane.warmups import WarmUps
from kvgate.gateway.observe.logs import AccessLog
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.observe.traffic import TrafficWindow
from kvgate.gateway.routing import Routing
from kvgate.gateway.upstream.transport import Upstream, UpstreamResponse
from kvgate.tokens.models import Tokenizers
from kvgate.types import SessionKey

log = logging.getLogger("kvgate.gateway.dataplane.proxy")


_NOT_FORWARDED = HOP_BY_HOP | {"content-encoding"}
"""Request headers not passed to the worker: the server already decoded the body (gzip,
deflate), so the bytes forwarded are not in the encoding the client named."""

CREDENTIALS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"})
"""Headers (lower case) that carry a client's credentials: with client API keys, or a
worker key of the gateway's own, none of them is forwarded, whatever its case."""


@dataclass(frozen=True, slots=True)
class Forward:
    """How to forward a request that is not a generation: its features and body."""

    features: RequestFeatures
    body: bytes
    method: str = "POST"
    answer_key: Callable[[str], SessionKey | None] | None = None
    """The key the answer's id is bound to its worker under (``None``: not bound)."""
    unknown: GatewayError | None = None
    """Answered, never forwarded, when the store binds nothing to the session key (a
    continuation of a response the request's scope did not create, or forgotten)."""
    forget: SessionKey | None = None
    """Dropped from the store once the worker answers 2xx (a deleted stored response)."""


Describe = Callable[[bytes, str], Forward]
"""Builds a ``Forward`` from the body and the request's id (raises ``GatewayError``)."""


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
    """Handles ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/messages`` end to end."""

    def __init__(
        self,
        pool: WorkerPool,
        router: Placer,
        routing: Routing,
        *,
        budget: RetryBudget,
        metrics: GatewayMetrics,
        access_log: AccessLog,
        features: FeatureConfig,
        max_retries: int,
        response_headers: bool,
        strip_client_auth: bool,
        key_names: KeyNames | None = None,
        draining: Callable[[], bool],
        rng: random.Random,
        stream_usage: bool = True,
        outcomes: OutcomeRecorder | None = None,
        expose_worker_urls: bool = False,
        slots: SlotPlane | None = None,
        traffic: TrafficWindow | None = None,
        wall: Callable[[], float] = time.time,
        warm_ups: WarmUps | None = None,
        away: AwaySessions | None = None,
        tokenizers: Tokenizers | None = None,
    ) -> None:
        self.pool = pool
        self.away = away
        """Sessions away on a tool call: told of each session's request (``None``: none)."""
        self.tokenizers = tokenizers if tokenizers else None
        """The models' tokenizers (``tokenizers:``): a request's tokens for the exact index."""
        self.warm_ups = warm_ups
        """Sends the policy's warm-ups after placements (``None``: none are sent)."""
        self.router = router
        self.routing = routing
        """The routing state in force (its ``aliases``: model names clients may use)."""
        self.budget = budget
        self.metrics = metrics
        self.features = features
        self.max_retries = max_retries
        self.strip_client_auth = strip_client_auth
        self.key_names = key_names
        """The client keys' names, for the access log (``None``: no key is named)."""
        self._not_forwarded_keyed = _NOT_FORWARDED | CREDENTIALS
        """Not forwarded to a worker with a key of its own: the client's credentials."""
        self._not_forwarded = self._not_forwarded_keyed if strip_client_auth else _NOT_FORWARDED
        """Not forwarded to other workers (with client API keys: the credentials too)."""
        self.draining = draining
        self.rng = rng
        self.stream_usage = stream_usage
        self.outcomes = outcomes
        self.slots = slots
        self.relay = Relay(
            metrics=metrics,
            access_log=access_log,
            response_headers=response_headers,
            expose_worker_urls=expose_worker_urls,
            outcomes=outcomes,
            traffic=traffic,
            wall=wall,
        )
        """Writes each answer out and records the request's outcome."""
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._new_id = _RequestIds()

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions`` on aiohttp's server."""
        exchange = AiohttpExchange(request)
        await self.handle(exchange, "/v1/chat/completions", "chat")
        return exchange.result()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions`` on aiohttp's server."""
        exchange = AiohttpExchange(request)
        await self.handle(exchange, "/v1/completions", "completions")
        return exchange.result()

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/messages`` (Anthropic's Messages API) on aiohttp's server."""
        exchange = AiohttpExchange(request)
        await self.handle(exchange, "/v1/messages", "messages")
        return exchange.result()

    async def handle(
        self,
        request: Exchange,
        path: str,
        endpoint: Endpoint,
        *,
        describe: Describe | None = None,
    ) -> None:
        """Parse, route, forward (with retries) and answer one request.

        ``describe`` builds the features of a request that is not a generation
        (embeddings, responses, tokenize, any other path); it may rewrite the body.
        """
        started = time.monotonic()
        # The gateway's own id keys its books (the policy's queues per worker, the slot
        # plane's flights, warm-ups): one per request, whatever the client sends. The
        # client's ``X-Request-ID`` (else that same id) is echoed, forwarded and logged.
        own_id = self._new_id()
        request_id = request.headers.get(REQUEST_ID) or own_id
        request.set_request_id(request_id)
        if self.draining():
            raise DrainingError("the gateway is shutting down")
        self.in_flight += 1
        self.idle.clear()
        outcome = Outcome(method=request.method, request_id=request_id)
        if self.key_names is not None:
            outcome.key = self.key_names.of(request.headers)
        features: RequestFeatures | None = None
        try:
            body = await request.read()
            if describe is not None:
                forward = describe(body, own_id)
                features, body = forward.features, forward.body
                outcome.method = forward.method
                outcome.answer_key = forward.answer_key
                outcome.forget = forward.forget
                outcome.body = body
                looked: Looked | None = None
                if forward.unknown is not None:
                    key = features.affinity_key
                    looked = await self.router.read(key) if key is not None else None
                    if looked is None:
                        raise forward.unknown
                await self._forward(
                    request,
                    path,
                    body=body,
                    features=features,
                    started=started,
                    outcome=outcome,
                    looked=looked,
                )
                return
            features, payload, body = self._features(body, request, own_id, endpoint)
            if self.tokenizers is not None:
                features = await self._tokenize(features, payload, endpoint)
            if not self.pool.serves(features.model):
                # The access log says what was asked; metric labels never carry a
                # client's made-up model name (one series per name, forever).
                outcome.asked_model, features = features.model, None
                raise unknown_model_error(self.pool, outcome.asked_model)  # 404, or 503
            if self.away is not None:
                self.away.returned(features.session_key)  # back from a tool call, if away
            if self.slots is not None:
                features = self.slots.annotate(features)  # KV that can follow the session
            outcome.messages = endpoint == "messages"  # its stream carries usage anyway
            if (
                self.stream_usage
                and features.stream
                and not outcome.messages
                and not client_wants_stream_usage(payload)
            ):
                # Ask for usage anyway: it is the policy's only cache feedback on streams.
                body = with_stream_usage(body, payload)
                outcome.strip_usage = True
            outcome.body = body
            await self._forward(
                request,
                path,
                body=body,
                features=features,
                started=started,
                outcome=outcome,
                payload=(payload, endpoint),
            )
        except GatewayError as exc:
            outcome.status = exc.status
            if isinstance(exc, OverloadedError):
                outcome.shed = exc.reason
            outcome.refused = outcome.shed or exc.code
            raise
        except asyncio.CancelledError:
            if not outcome.answered:  # else the client went once it had the whole answer
                outcome.status = 499
                if features is not None:
                    self.metrics.client_disconnects.labels(features.model).inc()
            raise
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self.idle.set()
            self.relay.record(features, outcome, started, request_id, path)

    def _features(
        self, body: bytes, request: Exchange, request_id: str, endpoint: Endpoint
    ) -> tuple[RequestFeatures, dict[str, Any], bytes]:
        """The request's features, decoded body and the body to forward (an alias
        resolved to its model); 400/404 errors on a bad one."""
        try:
            payload = json.loads(body)
        except ValueError:
            raise InvalidRequestError("the request body is not valid JSON") from None
        except RecursionError:
            raise InvalidRequestError("the request body's JSON is nested too deeply") from None
        aliases = self.routing.state.aliases
        if aliases and isinstance(payload, dict):
            target = aliases.get(payload.get("model"))  # type: ignore[arg-type]
            if target is not None:
                payload["model"] = target
                body = json.dumps(payload, separators=(",", ":")).encode()
        try:
            features = prefix.build_features(
                payload,
                request.headers,
                self.features,
                request_id=request_id,
                endpoint=endpoint,
                peer=request.peer,
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

    async def _tokenize(
        self, features: RequestFeatures, payload: dict[str, Any], endpoint: Endpoint
    ) -> RequestFeatures:
        """``features`` with the prompt's tokens, by its model's tokenizer (if it has one)."""
        tokenizers, model = self.tokenizers, features.model
        assert tokenizers is not None
        post = None
        if tokenizers.wants_worker(model):
            worker = next((w for w in self.pool if w.model == model), None)
            if worker is not None:
                post = partial(_post_short, worker.upstream, worker.config.url)
        tokens = await tokenizers.tokens(model, endpoint, payload, post)
        return replace(features, token_ids=tokens) if tokens else features

    async def _forward(
        self,
        request: Exchange,
        path: str,
        *,
        body: bytes,
        features: RequestFeatures,
        started: float,
        outcome: Outcome,
        payload: tuple[dict[str, Any], Endpoint] | None = None,
        looked: Looked | None = None,
    ) -> None:
        affinity = looked if looked is not None else await self.router.lookup(features)
        budget, tenant = self.budget, features.tenant
        budget.start(tenant)  # its retries are charged to its tenant
        excluded: frozenset[str] = frozenset()
        last_failure: UpstreamError | None = None
        # Attempts that answered 5xx, not settled yet: one that another worker then
        # serves was the worker's fault; the same error from the next worker follows
        # the request, and neither is charged.
        unsettled: list[Attempt] = []
        # Before the first byte, a request that failed on a canary version may be
        # served by the stable one (else a failing canary's sessions only ever fail).
        forced: str | None = None
        stable = self.router.stable_version(features.model)
        try:
            while True:
                try:
                    attempt = await self.router.place(
                        features, affinity, excluded, forced, started=started
                    )
                except NoHealthyWorkerError:
                    if outcome.retries and last_failure is not None:
                        tried = outcome.attempt.version if outcome.attempt else stable
                        if forced is None and stable is not None and tried != stable:
                            forced = stable  # no other canary worker: the stable one
                            continue
                        _settle(unsettled, served=False)
                        raise self._client_error(last_failure, features) from None
                    raise
                affinity = attempt.affinity  # read by ``place`` if the fleet asked for it
                if payload is not None and self.warm_ups is not None:
                    self.warm_ups.placed(features, *payload, attempt.worker)
                async with attempt:
                    outcome.attempt = attempt
                    worker = attempt.worker
                    try:
                        headers = self._upstream_headers(request, worker, outcome.request_id)
                        if (
                            self.slots is not None
                            and outcome.method == "POST"
                            and self.slots.manages(worker)
                        ):
                            # A llama.cpp worker: a slot lease (offload/restore/migration).
                            attempt.sent()
                            upstream = await self.slots.post(
                                worker,
                                path,
                                body,
                                headers,
                                features.affinity_key,
                                prefix=features.prefix_hashes,
                                tokens=len(features.token_ids) or features.prompt_chars // 4,
                                request_id=features.request_id,
                            )
                            # The reason says which tier the KV came from: slot, disk, ...
                            if tier := upstream.headers.get(TIER_HEADER):
                                attempt.reason = f"{attempt.reason}/{tier}"
                        else:
                            # The prefix-state write waits until the request is out.
                            upstream = await worker.upstream.send(
                                outcome.method, path, body, headers, sent=attempt.sent
                            )
                        attempt.answered(upstream.status)
                        if upstream.status == 429 or upstream.status >= 500:
                            await self._drain_error(upstream)
                            raise UpstreamError(status=upstream.status)
                    except UpstreamError as exc:
                        attempt.failed(exc.kind, exc.status)  # its slot freed before the backoff
                        last_failure = exc
                        self.metrics.upstream_errors.labels(worker.id, exc.kind).inc()
                        if exc.status is not None and exc.status != 429:
                            unsettled.append(attempt)
                            statuses = [a.state.status for a in unsettled]
                            same = blame(statuses, served=False) is Blame.REQUEST
                            on_canary = stable is not None and attempt.version != stable
                            if same and on_canary and forced is None:
                                forced = stable  # the canary may be at fault: ask the stable one
                            elif same:
                                # Two workers gave this request the same error: it is the
                                # request's doing. Neither worker is charged, nor retried.
                                _settle(unsettled, served=False)
                                raise self._request_fault(exc.status, outcome.retries + 1) from None
                        if not self._retry(exc, features, outcome):
                            _settle(unsettled, served=False)
                            raise self._client_error(exc, features) from None
                        excluded = excluded | {worker.id}
                        if attempt.bound is not None:
                            affinity = attempt.bound  # what this attempt bound; a retry moves it
                        await asyncio.sleep(budget.backoff(outcome.retries, self.rng))
                        continue
                    # Another worker served what these failed: that was the workers' fault.
                    _settle(unsettled, served=True)
                    await self.relay.respond(
                        request,
                        features=features,
                        attempt=attempt,
                        upstream=upstream,
                        started=started,
                        outcome=outcome,
                    )
                    return
        finally:
            budget.end(tenant, outcome.budgeted)

    def _retry(self, exc: UpstreamError, features: RequestFeatures, outcome: Outcome) -> bool:
        """True when a request whose attempt failed so may be retried on another worker."""
        if not exc.retryable or outcome.retries >= self.max_retries:
            return False
        if exc.status is not None:
            # A worker that answered 5xx/429 may be overloaded: its retries spend the
            # budget. A connection failure did no work anywhere, so re-picking it adds
            # no load and is only bounded by count.
            if not self.budget.allow(features.tenant):
                self.metrics.retries_denied.labels(features.model).inc()
                return False
            outcome.budgeted += 1
        outcome.retries += 1
        self.metrics.retries.labels(features.model).inc()
        return True

    def _request_fault(self, status: int, attempts: int) -> GatewayError:
        # Only what is known: the same answer from each may be the request's doing, or
        # the workers' own (faults of their own that happen to match).
        return BadGatewayError(
            f"{attempts} workers each answered this request {status}; it was not retried further"
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
        return BadGatewayError(
            f"upstream failure serving {features.model!r}: {public_failure(exc)}"
        )

    def _upstream_headers(
        self, request: Exchange, worker: Worker, request_id: str
    ) -> dict[str, str]:
        headers: dict[str, str] = {}
        connection = request.headers.get("Connection")
        api_key = worker.config.api_key
        drop = self._not_forwarded if api_key is None else self._not_forwarded_keyed
        if connection:
            drop = drop | {t.strip().lower() for t in connection.split(",")}
        for name, value in request.headers.items():
            if name.lower() not in drop:  # every case of a name: AUTHORIZATION too
                headers[name] = value
        headers[REQUEST_ID] = request_id
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        return headers


def _settle(attempts: list[Attempt], *, served: bool) -> None:
    """Settle a request's attempts that answered 5xx, as the second opinion says
    (``core.outlier.blame``): their workers' fault (charged) or not (the same error
    from two workers is the request's; one error nobody else was asked about is unknown).
    """
    if attempts:
        statuses = [attempt.state.status for attempt in attempts]
        fault = blame(statuses, served=served) is Blame.WORKER
        for attempt in attempts:
            attempt.settle(fault)
    attempts.clear()


async def _post_short(upstream: Upstream, url: str, path: str, body: bytes) -> tuple[int, bytes]:
    """One short POST to a worker (its ``/tokenize``), as ``tokens.remote.Post``."""
    return await upstream.post_short(url + path, body, TOKENIZE_TIMEOUT_S)


TOKENIZE_TIMEOUT_S = 2.0
"""How long a worker's ``/tokenize`` may take before the request goes on without tokens."""
