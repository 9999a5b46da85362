"""The endpoint picker's protocol: Envoy's external processing (ext_proc) as the Gateway API
Inference Extension uses it.

One gRPC stream is one HTTP request. Envoy sends the request's headers and body;
the picker decides with the same router (``core.route``, the store, the pool, the
versions) as the built-in proxy and answers with the chosen endpoint: the
``x-gateway-destination-endpoint`` header and the same value under ``envoy.lb`` in
the dynamic metadata (``ip:port``, or an ordered fallback list ``ip:port,ip:port``).
What the gateway refuses is an immediate response: 429 with ``Retry-After`` when
shed, 503 when no endpoint is ready (or none of the proxy's subset hint is), 4xx
for a request that is not one. Then Envoy sends the response's headers (with the
endpoint that actually served under ``envoy.lb``), body and trailers, which become
the events of the request's ``PickedRequest``.

Body modes, as Envoy's ``ProtocolConfiguration`` on the first message says (else
``epp.request_body_mode``): ``BUFFERED`` (headers answered at once, the decision
on the whole body as a header mutation) and ``FULL_DUPLEX_STREAMED`` (nothing is
answered until the body has ended; then the headers response carries the
decision and the body goes back as streamed chunks, as the protocol requires).
Response bodies in full-duplex mode are echoed chunk by chunk.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import grpc
from envoy.config.core.v3.base_pb2 import HeaderValueOption
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorServicer
from multidict import CIMultiDict

from kvgate.core import prefix
from kvgate.core.features import RequestFeatures
from kvgate.core.prefix import FeatureConfig, request_priority, request_tenant
from kvgate.gateway.dataplane.attempt import PassiveHealth, Placer
from kvgate.gateway.dataplane.eppwire import (
    DESTINATION,
    LB_NAMESPACE,
    REQUEST_ID,
    SERVED,
    SUBSET,
    SUBSET_NAMESPACE,
    endpoints_in,
    filter_metadata,
    header,
    headers_of,
    immediate,
    metadata,
    streamed_body,
    streamed_request,
)
from kvgate.gateway.dataplane.errors import (
    BodyTooLargeError,
    DrainingError,
    GatewayError,
    InvalidRequestError,
    NoHealthyWorkerError,
    OverloadedError,
)
from kvgate.gateway.dataplane.middleware import require_key
from kvgate.gateway.dataplane.models import unknown_model_error
from kvgate.gateway.dataplane.passthrough import Keys, confine, session_keys
from kvgate.gateway.dataplane.picked import PickedRequest
from kvgate.gateway.dataplane.relay import (
    REASON_HEADER,
    VERSION_HEADER,
    WORKER_HEADER,
    AwaySessions,
    Outcome,
    Relay,
    public_worker_name,
)
from kvgate.gateway.dataplane.usage import client_wants_stream_usage, with_stream_usage
from kvgate.gateway.observe.metrics import EppMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.routing import Routing

_FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
_BUFFERED = ProcessingMode.BUFFERED
_CHUNK = 62 * 1024
"""Largest body chunk sent back in full-duplex mode (Envoy's gRPC messages stay small)."""
_own_ids = itertools.count()  # the picker's request ids, its books' keys (x-request-id: logged)
_WITH_STREAM_OPTIONS = ("/v1/chat/completions", "/v1/completions")
"""Where OpenAI's ``stream_options.include_usage`` applies (Messages streams carry usage)."""
_GENERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/messages": "messages",
}


@dataclass(frozen=True, slots=True)
class PickerSettings:
    """What the picker needs besides the router: the request path's own settings."""

    features: FeatureConfig
    routing: Routing
    """The routing state in force (its ``aliases``)."""
    draining: Callable[[], bool]
    response_headers: bool = True
    fallbacks: int = 2
    """Endpoints after the picked one in the fallback list (same model and version)."""
    full_duplex_default: bool = False
    """The request body mode assumed when Envoy sends no ``ProtocolConfiguration``."""
    max_body_bytes: int = 10 * 1024 * 1024
    stream_usage: bool = True
    """Ask workers for a stream's usage the client did not (full-duplex: taken out again)."""
    api_keys: tuple[bytes, ...] = ()  # client keys: a request with none is a 401, as by serve


def endpoint_of(worker: Worker) -> str:
    """A worker's ``ip:port`` as the protocol names it (its URL's authority)."""
    return urlsplit(worker.id).netloc


class ExtProc(ExternalProcessorServicer):  # type: ignore[misc]
    """``envoy.service.ext_proc.v3.ExternalProcessor``: one stream per request."""

    def __init__(
        self,
        router: Placer,
        pool: WorkerPool,
        relay: Relay,
        passive: PassiveHealth,
        settings: PickerSettings,
        *,
        metrics: EppMetrics | None = None,
        away: AwaySessions | None = None,
    ) -> None:
        self.away = away
        """Sessions away on a tool call: told of each session's request (``None``: none)."""
        self.router = router
        self.pool = pool
        self.relay = relay
        self.passive = passive
        self.settings = settings
        self.streams = 0
        """Streams open now (a drain waits for none)."""
        self.protocol_errors = 0
        """Streams that broke the protocol's order (for tests and the soak)."""
        self._endpoints: dict[str, str] = {}
        self.metrics = metrics
        if metrics is not None:
            metrics.streams.set_function(lambda: self.streams)

    def endpoint(self, worker: Worker) -> str:
        """``ip:port`` of ``worker`` (kept per worker id)."""
        found = self._endpoints.get(worker.id)
        if found is None:
            found = self._endpoints[worker.id] = endpoint_of(worker)
        return found

    def worker_at(self, endpoint: str) -> Worker | None:
        """The pool's worker at ``endpoint`` (``None``: not one of ours)."""
        for worker in self.pool:
            if self.endpoint(worker) == endpoint:
                return worker
        return None

    async def Process(  # noqa: N802 (the gRPC method's name)
        self, requests: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> None:
        """Answer one request's messages in order; the request ends with the stream.

        ``context.read``/``write``: each answer goes out before the next message is read.
        """
        stream = _Stream(self, grpc_peer_address(context.peer()))
        self.streams += 1
        read, write, eof = context.read, context.write, grpc.aio.EOF
        try:
            while not stream.finished:
                message = await read()
                if message is eof:
                    return
                for answer in await stream.on(message):
                    await write(answer)
        finally:
            self.streams -= 1
            stream.close()


def grpc_peer_address(peer: str | None) -> str | None:
    """The IP address in a gRPC peer (``ipv4:10.0.0.7:41234``); ``None`` for ``unix:``."""
    kind, _, rest = (peer or "").partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host = unquote(rest).rpartition(":")[0]
    return host.removeprefix("[").removesuffix("]") or None


def _outcome_of(exc: GatewayError) -> str:
    """The ``EppMetrics.OUTCOMES`` word for a request the picker refused."""
    if isinstance(exc, OverloadedError):
        return "shed"
    if isinstance(exc, DrainingError):
        return "draining"
    if isinstance(exc, NoHealthyWorkerError):
        return "no_endpoint"
    return "bad_request" if exc.status < 500 else "error"


class _Stream:
    """The state of one request's ext_proc stream."""

    def __init__(self, server: ExtProc, peer: str | None = None) -> None:
        self.server = server
        self.peer = peer
        """Envoy's address (the hop that ran ext_authz: ``session_scope``'s trusted peer)."""
        self.started = time.monotonic()
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.body = bytearray()
        self.full_duplex = server.settings.full_duplex_default
        self.response_duplex = self.full_duplex
        self.subset: list[str] | None = None
        self.decided = False
        self.finished = False
        self.picked: PickedRequest | None = None
        self.picked_endpoints: list[str] = []
        self.headers_answered = False
        self.body_seen = False
        self.first = True
        self.path = ""
        self.features: RequestFeatures | None = None
        self.keys: Keys | None = None
        self.payload: dict[str, Any] | None = None
        self.aliased = False
        self.arrived = 0.0
        """When the message being answered arrived (``perf_counter``)."""

    async def on(self, request: pb.ProcessingRequest) -> Sequence[pb.ProcessingResponse]:
        """The answers to one message (none while a full-duplex body is still coming)."""
        self.arrived = time.perf_counter()
        if self.first:
            self.first = False
            if request.HasField("protocol_config"):
                config = request.protocol_config
                self.full_duplex = config.request_body_mode == _FULL_DUPLEX
                self.response_duplex = config.response_body_mode == _FULL_DUPLEX
        kind = request.WhichOneof("request")
        if kind == "request_headers":
            return await self._request_headers(request)
        if kind == "request_body":
            return await self._request_body(request.request_body)
        if kind == "request_trailers":
            answers = [] if self.decided else await self._decide(body_ends=False)
            if self.finished:
                return answers
            return [*answers, pb.ProcessingResponse(request_trailers=pb.TrailersResponse())]
        if kind is not None and kind.startswith("response_") and not self.decided:
            self._protocol_error()  # a response before any request was decided
            return []
        if kind == "response_headers":
            return await self._response_headers(request)
        if kind == "response_body":
            return await self._response_body(request.response_body)
        if kind == "response_trailers":
            if self.picked is not None:
                await self.picked.response_end()
            self.finished = True
            return [pb.ProcessingResponse(response_trailers=pb.TrailersResponse())]
        self._protocol_error()
        return []

    def _protocol_error(self) -> None:
        self.server.protocol_errors += 1
        self.finished = True

    async def _request_headers(
        self, request: pb.ProcessingRequest
    ) -> Sequence[pb.ProcessingResponse]:
        if self.headers_answered or self.decided:
            self._protocol_error()
            return []
        message = request.request_headers
        self.headers = headers_of(message)
        hint = filter_metadata(request, SUBSET_NAMESPACE)
        if hint is not None and SUBSET in hint:
            self.subset = endpoints_in(hint[SUBSET]) or []
        if message.end_of_stream:
            return await self._decide(body_ends=True)
        if self.full_duplex:
            return []  # the decision waits for the body: the answer to these headers carries it
        self.headers_answered = True
        return [pb.ProcessingResponse(request_headers=pb.HeadersResponse())]

    async def _request_body(self, message: pb.HttpBody) -> Sequence[pb.ProcessingResponse]:
        if self.decided:
            self._protocol_error()  # body after the decision: not in this protocol
            return []
        self.body_seen = True
        self.body += message.body
        if len(self.body) > self.server.settings.max_body_bytes:
            self.finished = True
            self._decided("bad_request")
            return [immediate(BodyTooLargeError("the request body is too large"))]
        if message.end_of_stream or not self.full_duplex:
            # Buffered: the one body message is the whole body (trailers may follow).
            return await self._decide(body_ends=message.end_of_stream)
        return []

    async def _decide(self, *, body_ends: bool) -> list[pb.ProcessingResponse]:
        """Place the request; the answers that carry the decision (or refuse it).

        The decision rides on the answer to the headers when they are still
        unanswered (no body, or full-duplex), else on the answer to the body.
        In full-duplex mode the body held so far goes back as streamed chunks.
        """
        self.decided = True
        try:
            picked = await self._place()
        except GatewayError as exc:
            self.finished = True
            self._refused(exc)
            self._decided(_outcome_of(exc))
            return [immediate(exc)]
        self.picked = picked
        self._decided("picked")
        value = ",".join(self.picked_endpoints)
        set_headers = [header(DESTINATION, value)]
        rewritten = self._rewritten(picked)
        if rewritten is not None:
            self.body = bytearray(rewritten)
            set_headers.append(header("content-length", str(len(rewritten))))
        common = pb.CommonResponse(
            header_mutation=pb.HeaderMutation(set_headers=set_headers), clear_route_cache=True
        )
        chosen = metadata(value)
        picked.sent()
        if self.headers_answered:
            if rewritten is not None:  # buffered: the whole body is replaced
                common.body_mutation.CopyFrom(pb.BodyMutation(body=rewritten))
            body = pb.BodyResponse(response=common)
            return [pb.ProcessingResponse(request_body=body, dynamic_metadata=chosen)]
        self.headers_answered = True
        answers = [
            pb.ProcessingResponse(
                request_headers=pb.HeadersResponse(response=common), dynamic_metadata=chosen
            )
        ]
        if self.full_duplex and self.body_seen:
            data = bytes(self.body)
            chunks = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [b""]
            for i, chunk in enumerate(chunks):
                last = body_ends and i == len(chunks) - 1
                answers.append(streamed_request(chunk, last))
        return answers

    def _decided(self, outcome: str) -> None:
        """Count the decision and the time since its message arrived (``EppMetrics``)."""
        metrics = self.server.metrics
        if metrics is not None:
            metrics.decisions.labels(outcome).inc()
            elapsed = time.perf_counter() - self.arrived
            metrics.decision_seconds.labels(outcome).observe(elapsed)

    def _rewritten(self, picked: PickedRequest) -> bytes | None:
        """The body to forward when it is not the client's (``None``: unchanged): an alias
        resolved to its model; a stream asked for its usage (full-duplex both ways, so
        the picker can take it out of the answer again: ``PickedRequest.strip_usage``)."""
        payload = self.payload
        if payload is None or self.features is None:
            return None
        features = self.features
        source = json.dumps(payload, separators=(",", ":")).encode() if self.aliased else None
        if (
            self.server.settings.stream_usage
            and features.stream
            and self.full_duplex
            and self.response_duplex
            and self.path in _WITH_STREAM_OPTIONS
            and not client_wants_stream_usage(payload)
        ):
            picked.strip_usage()
            return with_stream_usage(source or bytes(self.body), payload)
        return source

    async def _place(self) -> PickedRequest:
        """Route the request: its features, then the same router as the built-in proxy."""
        server = self.server
        settings = server.settings
        if settings.draining():
            raise DrainingError("the picker is shutting down")
        require_key(settings.api_keys, self.headers)
        target = self.headers.get(":path", "/")
        confine(target)  # what the built-in proxy would not forward, Envoy's route may send
        path = target.split("?", 1)[0]
        request_id = f"epp-{next(_own_ids):x}-{time.monotonic_ns():x}"
        self.path = path
        features = self._features(path, request_id)
        router = server.router
        excluded: frozenset[str] = frozenset()
        if self.subset is not None:
            allowed = set(self.subset)
            excluded = frozenset(w.id for w in server.pool if server.endpoint(w) not in allowed)
            if len(excluded) == len(server.pool):
                raise NoHealthyWorkerError("no endpoint of the proxy's subset is eligible")
        self.features = features
        if server.away is not None:
            server.away.returned(features.session_key)  # back from a tool call, if away
        keys, looked = self.keys, await router.lookup(features)
        if keys is not None and keys.unknown is not None:  # a continuation: its owner's only
            looked = await router.read(keys.key) if keys.key is not None else None
            if looked is None:
                raise keys.unknown
        attempt = await router.place(features, looked, excluded, started=self.started)
        picked = PickedRequest(
            server.relay,
            server.passive,
            features,
            attempt,
            started=self.started,
            path=path,
            request_id=self.headers.get(REQUEST_ID, ""),
        )
        picked.outcome.answer_key = keys.answer_key if keys is not None else None
        if keys is not None and keys.forget:
            picked.outcome.forget = keys.key
        self.picked_endpoints = [
            server.endpoint(attempt.worker),
            *self._fallbacks(attempt.worker, excluded),
        ]
        return picked

    def _fallbacks(self, picked: Worker, excluded: frozenset[str]) -> list[str]:
        """If the pick fails: ``fallbacks`` of its version, least loaded first, then a stable's."""
        count = self.server.settings.fallbacks
        if count <= 0:
            return []
        found = self._least_loaded(picked, picked.version, excluded, count)
        stable = self.server.router.stable_version(picked.model or "")
        if stable is not None and stable != picked.version:
            found += self._least_loaded(picked, stable, excluded, 1)
        return found

    def _least_loaded(
        self, picked: Worker, version: str, excluded: frozenset[str], count: int
    ) -> list[str]:
        pool = self.server.pool
        snap = pool.snapshot(picked.model or "", time.time(), time.monotonic(), version)
        others = sorted(
            (w for w in snap.workers if w.routable and w.id != picked.id and w.id not in excluded),
            key=lambda w: (w.in_flight / max(w.max_in_flight, 1), w.id),
        )
        found = []
        for state in others[:count]:
            worker = pool.get(state.id)
            if worker is not None:
                found.append(self.server.endpoint(worker))
        return found

    def _features(self, path: str, request_id: str) -> RequestFeatures:
        """The request's features (400 on a bad body, 404 on a model nobody serves)."""
        settings = self.server.settings
        payload: Any = {}
        if self.body:
            try:
                payload = json.loads(self.body)
            except ValueError:
                raise InvalidRequestError("the request body is not valid JSON") from None
            except RecursionError:
                raise InvalidRequestError("the request body's JSON is nested too deeply") from None
            if not isinstance(payload, dict):
                raise InvalidRequestError("the request body must be a JSON object")
        model = payload.get("model")
        aliases = settings.routing.state.aliases
        if isinstance(model, str) and model in aliases:
            payload["model"] = aliases[model]
            self.aliased = True
        self.payload = payload
        endpoint = _GENERATIONS.get(path)
        if endpoint is not None:
            try:
                features = prefix.build_features(
                    payload,
                    self.headers,
                    settings.features,
                    request_id=request_id,
                    endpoint=endpoint,  # type: ignore[arg-type]
                    peer=self.peer,
                )
            except prefix.InvalidRequest as exc:
                raise InvalidRequestError(exc.message, param=exc.param) from None
            except (UnicodeEncodeError, RecursionError):
                raise InvalidRequestError("the request is not valid text") from None
        else:
            features = self._other(payload, request_id)
        pool = self.server.pool
        if not pool.serves(features.model):
            raise unknown_model_error(pool, features.model)
        return features

    def _other(self, payload: dict[str, Any], request_id: str) -> RequestFeatures:
        """Features of a request that is not a generation: its model and session key only."""
        model = payload.get("model")
        if model is None:
            served = list(self.server.pool.models())
            if len(served) != 1:
                raise InvalidRequestError(
                    "'model' is required (the fleet serves several models)", param="model"
                )
            model = served[0]
        if not isinstance(model, str) or not model:
            raise InvalidRequestError("'model' must be a non-empty string", param="model")
        settings, path = self.server.settings.features, unquote(self.path)
        method = self.headers.get(":method", "POST")
        keys = self.keys = session_keys(
            settings, self.headers, payload, self.peer, path=path, method=method
        )
        return RequestFeatures(
            request_id=request_id,
            model=model,
            session_key=keys.key,
            session_source=keys.source,
            priority=request_priority(self.headers, settings, self.peer),
            stream=payload.get("stream") is True,
            tenant=request_tenant(keys.key, self.headers, settings, self.peer),
        )

    def _refused(self, exc: GatewayError) -> None:
        """Record a request the picker answered itself (shed, unavailable, invalid)."""
        outcome = Outcome(status=exc.status)
        if isinstance(exc, OverloadedError):
            outcome.shed = exc.reason
        outcome.refused = outcome.shed or exc.code
        request_id = self.headers.get(REQUEST_ID, "")
        self.server.relay.record(self.features, outcome, self.started, request_id, self.path)

    async def _response_headers(
        self, request: pb.ProcessingRequest
    ) -> Sequence[pb.ProcessingResponse]:
        message = request.response_headers
        picked = self.picked
        mutation: list[HeaderValueOption] = []
        if picked is not None and not picked.ended:
            headers = headers_of(message)
            lb = filter_metadata(request, LB_NAMESPACE) or {}
            served = lb.get(SERVED)
            worker, skipped = None, []
            if isinstance(served, str) and served:
                worker = self.server.worker_at(served.split(",")[0].strip())
                for endpoint in self.picked_endpoints:
                    if endpoint == served:
                        break
                    found = self.server.worker_at(endpoint)
                    if found is not None:
                        skipped.append(found)
            await picked.served(worker, skipped)
            try:
                status = int(headers.get(":status", "200"))
            except ValueError:
                status = 502
            picked.response_head(status, headers.get("content-type", ""))
            if self.server.settings.response_headers:
                attempt = picked.attempt
                mutation = [
                    header(WORKER_HEADER.lower(), self._worker_name(attempt.worker)),
                    header(VERSION_HEADER.lower(), attempt.version),
                    header(REASON_HEADER.lower(), attempt.reason),
                ]
            if message.end_of_stream:
                await picked.response_end()
                self.finished = True
        common = pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=mutation))
        return [pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=common))]

    async def _response_body(self, message: pb.HttpBody) -> Sequence[pb.ProcessingResponse]:
        picked = self.picked
        if picked is not None:
            picked.response_chunk(message.body)
            await picked.remember_answer(message.body)  # before the client has the id
        if self.response_duplex:
            data = message.body
            if picked is not None:
                data = picked.relayed(data, message.end_of_stream)
            answer = pb.ProcessingResponse(response_body=streamed_body(data, message.end_of_stream))
        else:
            answer = pb.ProcessingResponse(response_body=pb.BodyResponse())
        if message.end_of_stream:
            if picked is not None:
                await picked.response_end()
            self.finished = True
        return [answer]

    def _worker_name(self, worker: Worker) -> str:
        if self.server.relay.expose_worker_urls:
            return worker.id
        return public_worker_name(worker.id, worker.config.name)

    def close(self) -> None:
        """The stream is over: a request not ended yet broke off (client or proxy went)."""
        if self.picked is not None and not self.picked.ended:
            self.picked.broken()
