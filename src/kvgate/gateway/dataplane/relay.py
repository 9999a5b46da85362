"""Relaying a worker's answer to the client, and recording how the request ended.

Split from ``proxy``, which places and retries: once an attempt has its answer, the
``Relay`` writes it out (whole, or as a stream), reports the answer's events to the
``Attempt`` (which ends once: completed when the client has all of it, failed when
the worker broke it off, cancelled when the client went first), and records the
request: metrics, the traffic ring and the access log.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import xxhash

from kvgate.core.features import RequestFeatures
from kvgate.gateway.control.outcomes import OutcomeRecorder
from kvgate.gateway.dataplane.attempt import Attempt
from kvgate.gateway.dataplane.errors import (
    AnthropicShapedError,
    BadGatewayError,
    UpstreamBroken,
    UpstreamError,
)
from kvgate.gateway.dataplane.exchange import Exchange
from kvgate.gateway.dataplane.usage import (
    MessagesTap,
    StreamTap,
    Usage,
    UsageStripper,
    ends_in_tool_call,
    opening_only,
    usage_from_body,
)
from kvgate.gateway.observe.logs import AccessLog, AccessRecord
from kvgate.gateway.observe.metrics import CounterCell, GatewayMetrics, HistogramCell
from kvgate.gateway.observe.pool import Worker
from kvgate.gateway.observe.traffic import TrafficWindow
from kvgate.gateway.upstream.transport import UpstreamResponse

REQUEST_ID = "X-Request-ID"
WORKER_HEADER = "X-Kvgate-Worker"
VERSION_HEADER = "X-Kvgate-Model-Version"
REASON_HEADER = "X-Kvgate-Route-Reason"
GATEWAY_ID_HEADER = "X-Kvgate-Request-ID"  # the gateway's own id (``Outcome.request_id``)

# RFC 9110 hop-by-hop headers, plus those the client library sets itself.
HOP_BY_HOP = frozenset(
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

_OWN_HEADERS = HOP_BY_HOP | {
    h.lower() for h in (WORKER_HEADER, VERSION_HEADER, REASON_HEADER, GATEWAY_ID_HEADER)
}
"""A worker's response headers not relayed: hop-by-hop ones and the gateway's own (a
worker's ``X-Kvgate-Worker`` would pass for the gateway's)."""

_LOCATIONS = frozenset({"location", "content-location"})


def _relative(value: str, host: str) -> str:
    """A ``Location`` naming the worker itself (``http://10.0.0.5:8000/v1/x``, a
    redirect's) as a path: it never shows a client the worker's address, nor sends one
    around the gateway (nginx's ``proxy_redirect default``). Other values pass."""
    parts = urlsplit(value)
    if parts.netloc and parts.netloc.rpartition("@")[2].lower() == host.lower():
        return urlunsplit(("", "", parts.path or "/", parts.query, parts.fragment))
    return value


_PUBLIC_KIND = {
    "unavailable": "the worker could not be reached",
    "timeout": "the worker did not answer in time",
    "broken": "the worker's response broke off",
}


def public_failure(exc: UpstreamError) -> str:
    """What a client may read of an upstream failure: its kind, never the worker's
    address, bytes or exception text (those are in the gateway's log and metrics)."""
    if exc.status is not None:
        return f"the worker answered {exc.status}"
    return _PUBLIC_KIND.get(exc.kind, "the worker failed")


_ANSWER_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')


def answer_id(data: bytes) -> str | None:
    """The id an answer names first (within its first 4 KiB): a stored response's."""
    return found.group(1).decode() if (found := _ANSWER_ID.search(data, 0, 4096)) else None


class AwaySessions(Protocol):
    """Where sessions away on a tool call are booked (``gateway.control.toolcalls``): told
    of each session's request as it arrives; its leaving is its attempt's end's."""

    def returned(self, key: str | None) -> None:
        """A request of session ``key`` arrived."""


@dataclass(slots=True)
class Outcome:
    """What one request's answer was, for metrics and the access log."""

    status: int = 0
    attempt: Attempt | None = None
    """The request's latest attempt (``None``: never placed)."""
    ttft: float | None = None
    usage: Usage | None = None
    answered: bool = False
    """The client had the whole answer (a stream: through its usage), whatever came after."""
    retries: int = 0
    budgeted: int = 0
    strip_usage: bool = False
    """The gateway asked the worker for stream usage the client did not ask for."""
    body: bytes = b""
    method: str = "POST"
    answer_key: Callable[[str], str | None] | None = None
    """Bind the id the answer starts with under the key this gives, for continuations."""
    forget: str | None = None
    """Drop this key's binding if the answer is a 2xx (``DELETE /v1/responses/{id}``)."""
    shed: str | None = None
    """Why the request was shed (429), for the access log and the dashboard."""
    refused: str | None = None
    """The shed reason or error code of a request the gateway answered itself."""
    last_chunk: float | None = None
    """When a stream's last chunk arrived (seconds after the start): inter-token latency."""
    asked_model: str = ""
    """The model a refused request named when no worker serves it (access log only)."""
    messages: bool = False
    """Anthropic's Messages API: its stream's usage and errors are in Anthropic's events."""
    request_id: str = ""
    """The client's ``X-Request-ID`` (else the gateway's own id, ``features.request_id``: its
    books' key, sent as ``X-Kvgate-Request-ID``): echoed to the client, forwarded, logged."""
    key: str | None = None  # the name of the client key it presented (``apikeys.KeyNames``)


class Relay:
    """Answers the client from a worker's response, and records each request's outcome."""

    def __init__(
        self,
        *,
        metrics: GatewayMetrics,
        access_log: AccessLog,
        response_headers: bool,
        expose_worker_urls: bool,
        outcomes: OutcomeRecorder | None,
        traffic: TrafficWindow | None,
        wall: Callable[[], float],
    ) -> None:
        self.metrics = metrics
        self.access_log = access_log
        self.response_headers = response_headers
        self.expose_worker_urls = expose_worker_urls
        self.outcomes = outcomes
        self.traffic = traffic
        """The dashboard's ring of recent traffic (``None``: not kept)."""
        self.wall = wall
        self._names: dict[str, str] = {}
        self._series: dict[tuple[str, str, str], _Series] = {}

    def _worker_name(self, worker: Worker) -> str:
        """The worker as clients see it: an id, its URL only with ``expose_worker_urls``."""
        if self.expose_worker_urls:
            return worker.id
        name = self._names.get(worker.id)
        if name is None:
            name = self._names[worker.id] = public_worker_name(worker.id, worker.config.name)
        return name

    def _headers(
        self, upstream: UpstreamResponse, attempt: Attempt, request_id: str
    ) -> list[tuple[str, str]]:
        drop = _OWN_HEADERS
        if connection := upstream.headers.get("Connection"):  # the names it lists: hop-by-hop
            drop = drop | {token.strip().lower() for token in connection.split(",")}
        host = attempt.worker.upstream.host
        headers = []
        for name, value in upstream.headers.items():
            if (lower := name.lower()) not in drop:
                headers.append((name, _relative(value, host) if lower in _LOCATIONS else value))
        headers.append((REQUEST_ID, request_id))
        if self.response_headers:
            headers.append((WORKER_HEADER, self._worker_name(attempt.worker)))
            headers.append((VERSION_HEADER, attempt.version))
            headers.append((REASON_HEADER, attempt.reason))
            headers.append((GATEWAY_ID_HEADER, attempt.features.request_id))
        return headers

    async def respond(
        self,
        request: Exchange,
        *,
        features: RequestFeatures,
        attempt: Attempt,
        upstream: UpstreamResponse,
        started: float,
        outcome: Outcome,
    ) -> None:
        """Relay the answer and end the attempt: completed once the client has all of it
        (then its binding renewed), failed if the worker broke it off, else cancelled."""
        headers = self._headers(upstream, attempt, outcome.request_id or features.request_id)
        done = False
        try:
            if upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
                done = await self._stream(
                    request, upstream, headers, started, outcome, attempt=attempt
                )
            else:
                data = await upstream.read()
                if upstream.status < 300 and not _looks_like_json_object(data):
                    # An empty or non-JSON 2xx is no OpenAI answer: the worker's failure.
                    raise UpstreamBroken("the worker's 2xx answer is not a JSON object")
                now = time.monotonic()
                attempt.token(now)
                outcome.ttft = now - started
                outcome.status = upstream.status
                outcome.usage = usage = usage_from_body(data)  # whoever reads the answer
                if usage is not None:
                    attempt.usage(usage.prompt, usage.cached, usage.completion, usage.engine_ttft)
                if upstream.status < 300 and ends_in_tool_call(data):
                    attempt.tool_call()  # booked at the attempt's end, whichever it is
                if outcome.forget is not None and upstream.status < 300:
                    await attempt.forget(outcome.forget)  # before the client hears it is gone
                await request.send(upstream.status, headers, data)
                done = outcome.answered = True
                if outcome.answer_key is not None:
                    await self._remember_answer(data, attempt, outcome.answer_key)
                recorder = self.outcomes
                if recorder is not None and recorder.wants_sample(features.model, attempt.version):
                    attempt.keep_sample(outcome.body, data)
        except UpstreamError as exc:
            # The whole-body read failed before anything was sent: a 502.
            self.metrics.upstream_errors.labels(attempt.worker.id, exc.kind).inc()
            attempt.failed(exc.kind)
            raise BadGatewayError(
                f"upstream failure serving {features.model!r}: {public_failure(exc)}"
            ) from None
        except ConnectionResetError:
            self._client_gone(features.model, outcome)
        finally:
            if not done:
                upstream.close()
            if done or outcome.answered:
                attempt.completed()
            else:  # failed (already ended), or the client went first
                attempt.cancelled()
        if (done or outcome.answered) and attempt.renews:
            await attempt.refresh()

    async def _stream(
        self,
        request: Exchange,
        upstream: UpstreamResponse,
        headers: list[tuple[str, str]],
        started: float,
        outcome: Outcome,
        *,
        attempt: Attempt,
    ) -> bool:
        """Pass an SSE stream through, each chunk told to ``attempt``; True when it ran
        to its end."""
        outcome.status = upstream.status
        # The head goes out with the first chunk when one is waiting (one write); else
        # alone at once, so a client sees the head as soon as the worker's arrived.
        await request.start_stream(upstream.status, headers, now=not upstream.ready)
        stripper = UsageStripper() if outcome.strip_usage else None
        # A stripper reads the usage itself and forwards whole events only (so the
        # stream is always at an event boundary): no tail to keep per chunk then.
        tap = (MessagesTap() if outcome.messages else StreamTap()) if stripper is None else None
        clock = time.monotonic
        last = 0.0
        # When the latest chunk arrived (0: none yet); noted in ``outcome`` once, at the end.
        # After the first chunk, a server that can write from a protocol callback gets
        # the chunks straight from the upstream connection (no task wake per chunk).
        token = attempt.state.token
        pump = _Pump(request, stripper, tap, token) if request.writes_now else None
        opening = True  # no chunk yet (the first names the answer: ``_remember_answer``)
        try:
            while True:
                chunk = upstream.take()
                if chunk is None:
                    if pump is None or outcome.ttft is None:
                        await upstream.arrival()
                        continue
                    await upstream.arrival(pump.feed)
                    last = max(last, pump.last)
                    if pump.failed is not None:
                        raise pump.failed
                    if held := pump.held:
                        pump.held = b""
                        await request.write(held)  # the client's buffer was full: wait for room
                        if tap is not None:
                            tap.feed(held)
                    continue
                if not chunk:
                    break
                last = clock()
                if outcome.ttft is not None:
                    token(last)
                else:
                    if opening and outcome.answer_key is not None:
                        await self._remember_answer(chunk, attempt, outcome.answer_key)
                    opening = False
                    if not opening_only(chunk):  # the first token: the policy hears it
                        attempt.token(last)
                        outcome.ttft = last - started
                data = stripper.feed(chunk) if stripper is not None else chunk
                if not data:
                    continue
                await request.write(data)
                if tap is not None:
                    tap.feed(data)
            if stripper is not None and (rest := stripper.flush()):
                await request.write(rest)
        except UpstreamError as exc:
            # Bytes already went to the client: no retry. End the stream with an
            # OpenAI-style error event (what clients raise on), then close. The worker
            # failed this attempt, whatever its headers said (outlier detection).
            self.metrics.upstream_errors.labels(attempt.worker.id, exc.kind).inc()
            attempt.failed(exc.kind)
            outcome.status = 502
            event = b"" if tap is None or tap.at_event_boundary else b"\n\n"
            error = BadGatewayError(
                f"the stream broke off: {public_failure(exc)}", code="stream_broken"
            )
            if outcome.messages:  # an Anthropic ``error`` event, as its clients raise on
                event += b"event: error\ndata: " + AnthropicShapedError(error).body() + b"\n\n"
            else:
                event += b"data: " + error.body() + b"\n\n"
            try:
                await request.write(event)
                await request.end()
            except (ConnectionResetError, RuntimeError):
                pass
            request.abort()
            return False
        except ConnectionResetError:
            # The client went away; dropping the upstream tells the worker. Past the usage
            # (the last event but ``[DONE]``) it had the whole answer: HTTP clients close
            # once they read ``[DONE]``, before the stream's last chunk.
            if _seen_usage(stripper, tap) is None:
                self._client_gone(attempt.worker.model or "", outcome)
            return False
        finally:
            if last:
                outcome.last_chunk = last - started
            # Cancelled too: what the worker computed, for the policy.
            outcome.usage = usage = _seen_usage(stripper, tap)
            outcome.answered = usage is not None
            if usage is not None:
                attempt.usage(usage.prompt, usage.cached, usage.completion, usage.engine_ttft)
            if stripper.tool_call if stripper is not None else tap is not None and tap.tool_call():
                attempt.tool_call()  # booked at the attempt's end, whichever it is
        outcome.answered = True
        with contextlib.suppress(ConnectionResetError):  # gone at ``[DONE]``: answered
            await request.end()
        return True

    async def _remember_answer(
        self, data: bytes, attempt: Attempt, key_of: Callable[[str], str | None]
    ) -> None:
        """Bind the answer's own id (the first ``"id"`` in its head) to its worker."""
        found = answer_id(data)
        if found is not None and (key := key_of(found)) is not None:
            await attempt.remember(key)

    def _client_gone(self, model: str, outcome: Outcome) -> None:
        outcome.status = 499
        self.metrics.client_disconnects.labels(model).inc()

    def record(
        self,
        features: RequestFeatures | None,
        outcome: Outcome,
        started: float,
        request_id: str,
        path: str = "",
    ) -> None:
        duration = time.monotonic() - started
        model = features.model if features is not None else ""
        placement = outcome.attempt
        worker = placement.worker.id if placement is not None else ""
        version = placement.version if placement is not None else ""
        reason = placement.reason if placement is not None else (outcome.refused or "error")
        status = outcome.status or 500
        usage = outcome.usage
        m = self.metrics
        m.cells.counter(m.requests, model, version, worker, str(status), reason).inc()
        if features is not None and placement is not None:
            series = self._series.get((model, version, worker))
            if series is None:
                series = self._series_of(model, version, worker)
            series.duration.observe(duration)
            if outcome.ttft is not None:
                (series.ttft or series.first_ttft(m)).observe(outcome.ttft)
                itl = _inter_token(outcome, usage)
                if itl is not None:
                    (series.itl or series.first_itl(m)).observe(itl)
                end = placement.state.end
                if end is not None and end.max_gap_s:  # a stall shows, however it ended
                    (series.gap or series.first_gap(m)).observe(end.max_gap_s)
            if usage is not None:
                tokens = series.tokens or series.first_tokens(m)
                tokens[0].inc(usage.prompt)
                tokens[1].inc(usage.cached)
                tokens[2].inc(usage.completion)
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
                    method=outcome.method,
                    path=path,
                    session=features.session_source.value if features is not None else "none",
                    stream=features.stream if features is not None else False,
                    prompt_tokens=usage.prompt if usage is not None else None,
                    cached_tokens=usage.cached if usage is not None else None,
                    completion_tokens=usage.completion if usage is not None else None,
                    key=outcome.key,
                )
            )

    def _series_of(self, model: str, version: str, worker: str) -> _Series:
        """The placed requests' series of one model, version and worker, made on first use."""
        if len(self._series) >= _SERIES_MAX:
            self._series.clear()  # bounded as the cell cache is
        m = self.metrics
        duration = m.cells.histogram(m.request_duration, model, version, worker)
        series = self._series[model, version, worker] = _Series(model, version, worker, duration)
        return series


_SERIES_MAX = 4096


class _Pump:
    """Relays body bytes from the upstream connection's ``data_received`` to the client.

    Called for each chunk while the relaying task waits: it strips or taps the chunk
    and writes it with ``write_now``. It stops (returns False, which wakes the task)
    when a chunk could not be sent at once (``held``: the task writes it, waiting for
    the client's room, so a slow client holds back the upstream) or the write failed
    (``failed``: the task raises it). It never raises into the connection's parser.
    """

    __slots__ = ("failed", "held", "last", "request", "stripper", "tap", "token")

    def __init__(
        self,
        request: Exchange,
        stripper: UsageStripper | None,
        tap: StreamTap | None,
        token: Callable[[float], None],
    ) -> None:
        self.request = request
        self.token = token
        """Told when each chunk arrived (``AttemptState.token``)."""
        self.stripper = stripper
        self.tap = tap
        self.last = 0.0
        """When the latest chunk arrived (0: none through here)."""
        self.held = b""
        self.failed: Exception | None = None

    def feed(self, chunk: bytes) -> bool:
        """Relay one chunk; False: stop, and wake the task."""
        self.last = now = time.monotonic()
        self.token(now)
        try:
            data = self.stripper.feed(chunk) if self.stripper is not None else chunk
            if not data:
                return True
            if not self.request.write_now(data):
                self.held = data
                return False
            if self.tap is not None:
                self.tap.feed(data)
        except Exception as exc:  # a protocol callback must not raise
            self.failed = exc
            return False
        return True


class _Series:
    """The cells a placed request updates, by (model, version, worker): one lookup for six.

    Each is a ``CellCache`` cell, so it updates the same series the cache's own would
    (a cell holds the series' values, not a copy), even after the cache starts over.
    A series is made on its first observation, as before (``None`` until then): a
    stream's inter-token latency or the token counts never appear empty.
    """

    __slots__ = ("duration", "gap", "itl", "model", "tokens", "ttft", "version", "worker")

    def __init__(self, model: str, version: str, worker: str, duration: HistogramCell) -> None:
        self.model, self.version, self.worker = model, version, worker
        self.duration = duration
        self.ttft: HistogramCell | None = None
        self.itl: HistogramCell | None = None
        self.gap: HistogramCell | None = None
        """The stream's longest gap between chunks (``kvgate_inter_token_latency_max``)."""
        self.tokens: tuple[CounterCell, CounterCell, CounterCell] | None = None
        """Prompt, cached and completion tokens."""

    def first_ttft(self, m: GatewayMetrics) -> HistogramCell:
        self.ttft = m.cells.histogram(m.ttft, self.model, self.version, self.worker)
        return self.ttft

    def first_itl(self, m: GatewayMetrics) -> HistogramCell:
        self.itl = m.cells.histogram(m.inter_token_latency, self.model, self.version, self.worker)
        return self.itl

    def first_gap(self, m: GatewayMetrics) -> HistogramCell:
        self.gap = m.cells.histogram(
            m.inter_token_latency_max, self.model, self.version, self.worker
        )
        return self.gap

    def first_tokens(self, m: GatewayMetrics) -> tuple[CounterCell, CounterCell, CounterCell]:
        cells, model, worker = m.cells, self.model, self.worker
        self.tokens = (
            cells.counter(m.prompt_tokens, model, worker),
            cells.counter(m.cached_tokens, model, worker),
            cells.counter(m.completion_tokens, model, worker),
        )
        return self.tokens


def _counts(usage: Usage | None) -> tuple[int | None, int | None, int | None]:
    """Prompt, cached and completion tokens (``None``: no usage)."""
    if usage is None:
        return None, None, None
    return usage.prompt, usage.cached, usage.completion


def _seen_usage(stripper: UsageStripper | None, tap: StreamTap | None) -> Usage | None:
    """The usage a relayed stream carried so far (``None``: none yet)."""
    if stripper is not None:
        return stripper.usage
    return tap.usage() if tap is not None else None


def _inter_token(outcome: Outcome, usage: Usage | None) -> float | None:
    """A stream's mean time between output tokens after the first (``None``: not a stream)."""
    if outcome.last_chunk is None or outcome.ttft is None or usage is None:
        return None
    if usage.completion < 2 or outcome.last_chunk <= outcome.ttft:
        return None
    return (outcome.last_chunk - outcome.ttft) / (usage.completion - 1)


def public_worker_name(url: str, name: str | None = None) -> str:
    """A worker's name for clients: its configured ``name``, else ``w-`` and a hash of its
    URL (stable across gateway replicas and restarts, and no internal address)."""
    return name or "w-" + xxhash.xxh3_64_hexdigest(url.encode())[:12]


def _looks_like_json_object(data: bytes) -> bool:
    """True when ``data`` is framed as a JSON object (a cheap check: no decoding)."""
    return data.lstrip()[:1] == b"{" and data.rstrip()[-1:] == b"}"
