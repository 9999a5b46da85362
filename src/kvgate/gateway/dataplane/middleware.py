"""The gateway's middleware: pure callables wrapping the inner handler, stacked in ``app``.

Outermost is the last-resort error middleware: every error leaves the gateway in
the OpenAI shape with the right status, and nothing unexpected becomes a
traceback on the wire (it is logged and answered with a plain 500).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Iterable, Mapping, Sequence

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestPayloadError

from kvgate.gateway.dataplane.errors import (
    BodyTooLargeError,
    GatewayError,
    HeadersTooLargeError,
    InvalidPathError,
    InvalidRequestError,
    NotFoundError,
    UnauthorizedError,
    shaped_for,
)
from kvgate.gateway.upstream.transport import unsafe_path

log = logging.getLogger("kvgate.gateway")

REQUEST_ID = "X-Request-ID"
REQUEST_ID_KEY = web.RequestKey("kvgate.request_id", str)
"""Where the proxy leaves the request id, so error responses carry it too."""


def _with_request_id(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    request_id = request.get(REQUEST_ID_KEY)
    if request_id is not None:
        response.headers[REQUEST_ID] = request_id
    return response


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every error into an OpenAI-shaped response (on the Messages API's path,
    Anthropic's shape); log the unexpected ones."""
    try:
        return await handler(request)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = _http_error(request, exc)
    except Exception as exc:
        error = _error_of(request, exc)
    response = shaped_for(request.path, error).response()
    return response if error.status == 404 else _with_request_id(request, response)


def _http_error(request: web.Request, exc: web.HTTPException) -> GatewayError:
    """aiohttp's own refusal (413, 404, 405, ...) as the gateway's error."""
    if exc.status == 413:
        return BodyTooLargeError(exc.text or "body too large")
    if exc.status == 404:
        return NotFoundError(f"no route for {request.method} {request.path}")
    return GatewayError(
        exc.reason or "request failed",
        status=exc.status,
        type="invalid_request_error" if exc.status < 500 else "server_error",
        code=str(exc.status),
        headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"},
    )


def _error_of(request: web.Request, exc: Exception) -> GatewayError:
    """Any other exception a handler raised, as the gateway's error (logged if unexpected)."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, (HttpProcessingError, RequestPayloadError)):
        # The body could not be read (bad framing or Content-Encoding): the client's doing.
        text = str(getattr(exc, "message", "") or exc).strip()
        reason = (text.splitlines()[0] if text else type(exc).__name__)[:200]
        return InvalidRequestError(f"the request body cannot be read: {reason}")
    if isinstance(exc, (RecursionError, UnicodeError)):
        return InvalidRequestError("the request is nested too deeply or is not valid Unicode")
    log.exception("unexpected error handling %s %s", request.method, request.path)
    return GatewayError("internal gateway error", status=500, code="internal_error")


@web.middleware
async def paths(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a request target that is not a normalized path (400), before any route.

    Read from the target as the client sent it: a dot segment must never reach a
    worker, nor match a route or a path-prefix check after something resolves it.
    Encoded slashes are refused where a path is forwarded (``passthrough``): the
    gateway's own paths may carry one (a worker's URL, a model ``org/name``).
    """
    why = unsafe_path(request.raw_path, slashes=False)
    if why is not None:
        raise InvalidPathError(f"{why}: only normalized paths are served")
    return await handler(request)


def header_limit(max_bytes: int, max_count: int) -> Middleware:
    """Refuse requests with more than ``max_bytes`` of headers or ``max_count`` of them (431)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        raw = request.raw_headers
        if len(raw) > max_count:
            raise HeadersTooLargeError(f"{len(raw)} request headers, over the limit of {max_count}")
        total = 0
        for name, value in raw:
            total += len(name) + len(value) + 4
        if total > max_bytes:
            raise HeadersTooLargeError(
                f"request headers are {total} bytes, over the limit of {max_bytes}"
            )
        return await handler(request)

    return check


def body_limit(max_bytes: int) -> Middleware:
    """Refuse a request whose declared ``Content-Length`` is over ``max_bytes`` (413) at
    once, rather than after reading (or waiting for) that much of it."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        declared = request.content_length
        if declared is not None and declared > max_bytes:
            raise BodyTooLargeError(
                f"request body of {declared} bytes is over the limit of {max_bytes} bytes"
            )
        return await handler(request)

    return check


OPEN_PATHS = frozenset({"/", "/healthz", "/readyz", "/health", "/metrics", "/dashboard"})
"""Paths client API keys do not guard: probes, ``/metrics`` (``metrics_auth``), the
dashboard's page (its data is an admin route)."""

OPEN_PREFIXES = ("/admin/", "/dashboard/")
"""Path prefixes with a guard of their own (the admin API's, ``/dashboard/state.json``
 included) or no data (the dashboard's assets)."""


def api_keys(keys: Iterable[str], protected_prefix: str | None = None) -> Middleware:
    """Require ``Authorization: Bearer <key>`` with one of ``keys`` (401).

    ``protected_prefix`` ``None``: on every path but ``OPEN_PATHS`` and ``OPEN_PREFIXES``
    (a path that reaches a worker outside ``/v1/``, vLLM's ``/tokenize``, is guarded too,
    and so is any route added later); else a path prefix, or an exact path (``/metrics``)
    when it does not end with ``/``.
    """
    allowed = [k.encode() for k in keys]
    exact = protected_prefix is not None and not protected_prefix.endswith("/")

    def guarded(path: str) -> bool:
        if protected_prefix is None:
            return path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES)
        return path == protected_prefix if exact else path.startswith(protected_prefix)

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if guarded(request.path):
            require_key(allowed, request.headers)
        return await handler(request)

    return check


def require_key(keys: Sequence[bytes], headers: Mapping[str, str]) -> None:
    """``UnauthorizedError`` (401) unless ``headers`` present one of ``keys`` (``key_presented``;
    no keys: the API is open). Every data plane's check: both servers' and the picker's."""
    if keys and not key_presented(headers.get("Authorization", ""), headers.get("x-api-key"), keys):
        raise UnauthorizedError(
            "Incorrect or missing API key. Pass it as 'Authorization: Bearer <key>'."
        )


def key_presented(authorization: str, x_api_key: str | None, keys: Iterable[bytes]) -> bool:
    """True when the request's one credential is one of ``keys``: the token of
    ``Authorization: Bearer`` (OpenAI's clients) when it has one, else ``x-api-key``
    (Anthropic's). The same credential scopes its sessions and picks its key's settings
    (``core.session.credential_of``): a valid ``x-api-key`` beside a bearer token that is
    no key would let an authenticated client name any scope it likes (a new tenant each
    request, past ``store.max_sessions_per_scope``)."""
    scheme, _, token = authorization.strip().partition(" ")
    given = token.strip() if scheme.lower() == "bearer" else ""
    if not given and x_api_key is not None:
        given = x_api_key.strip()
    if not given:
        return False
    raw = given.encode()
    return any(hmac.compare_digest(raw, key) for key in keys)
