"""The gateway's own errors and their OpenAI-shaped HTTP form.

Upstream failures are translated into these at the one upstream boundary
(``gateway.upstream``); handlers raise ``GatewayError`` subclasses and one
middleware turns them into ``{"error": {"message", "type", "code", "param"}}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from aiohttp import web

from kvgate.core.attempt import DEADLINE


class GatewayError(Exception):
    """An error the gateway answers itself, with an HTTP status and OpenAI error body."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        if code is not None:
            self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> bytes:
        """The OpenAI-shaped JSON error body."""
        return error_body(self.message, self.type, self.code, self.param)

    def response(self) -> web.Response:
        """This error as an aiohttp response."""
        return web.Response(
            status=self.status,
            body=self.body(),
            content_type="application/json",
            headers=self.headers,
        )


def error_body(message: str, type: str, code: str | None, param: str | None = None) -> bytes:
    """Serialise an OpenAI-shaped error."""
    return json.dumps(
        {"error": {"message": message, "type": type, "code": code, "param": param}}
    ).encode()


class InvalidRequestError(GatewayError):
    """400: malformed JSON or missing/invalid fields."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class InvalidPathError(InvalidRequestError):
    """400: a request target the gateway never forwards (a dot segment, an encoded slash)."""

    code = "invalid_path"


class UnauthorizedError(GatewayError):
    """401: missing or wrong client API key."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class NotFoundError(GatewayError):
    """404: an unknown path or model."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFoundError(NotFoundError):
    """404: no worker serves the requested model."""

    code = "model_not_found"


class BodyTooLargeError(GatewayError):
    """413: the request body is over the configured limit."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class HeadersTooLargeError(GatewayError):
    """431: the request headers are over the configured limit."""

    status = 431
    type = "invalid_request_error"
    code = "headers_too_large"


class RequestTimeoutError(GatewayError):
    """408: the client did not send its request (head or body) in time; the connection closes."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Connection": "close"})


class UnsupportedMediaError(GatewayError):
    """415: a request body in an encoding the gateway cannot read."""

    status = 415
    type = "invalid_request_error"
    code = "unsupported_encoding"


class OverloadedError(GatewayError):
    """429: shed; the client should come back after ``Retry-After`` seconds."""

    status = 429
    type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after: float, reason: str) -> None:
        seconds = max(1, math.ceil(retry_after))
        super().__init__(message, headers={"Retry-After": str(seconds)})
        self.reason = reason
        self.retry_after = retry_after


class NoHealthyWorkerError(GatewayError):
    """503: no routable worker for the model (or the gateway is draining)."""

    status = 503
    type = "server_error"
    code = "no_healthy_worker"


class DrainingError(NoHealthyWorkerError):
    """503: the gateway is shutting down and takes no new requests."""

    code = "draining"


class BadGatewayError(GatewayError):
    """502: every attempt failed upstream."""

    status = 502
    type = "server_error"
    code = "upstream_error"


class GatewayTimeoutError(GatewayError):
    """504: the upstream did not answer in time."""

    status = 504
    type = "server_error"
    code = "upstream_timeout"


class UpstreamError(Exception):
    """An upstream failure, raised by ``gateway.upstream`` in place of the client library's.

    Raised as is for an error status the gateway retries (5xx, 429), with
    ``status`` set; the subclasses name the other failures. ``retryable`` says
    whether another worker may be tried (only ever before the first byte).
    """

    kind: str = "status"
    retryable: bool = True

    def __init__(self, message: str = "", status: int | None = None) -> None:
        super().__init__(message or f"upstream returned {status}")
        self.status = status


class UpstreamUnavailable(UpstreamError):  # noqa: N818 (the names the design uses)
    """The worker could not be reached (refused, reset, connect timeout)."""

    kind = "unavailable"


class UpstreamTimeout(UpstreamError):  # noqa: N818 (the names the design uses)
    """The worker accepted the request but did not answer in time."""

    kind = "timeout"
    retryable = False


class UpstreamBroken(UpstreamError):  # noqa: N818 (the names the design uses)
    """The response broke off after it started (mid-stream); never retried."""

    kind = "broken"
    retryable = False


class UpstreamDeadline(UpstreamBroken):
    """The answer was still coming at ``timeouts.total_s`` and was cut off there: its
    length is the client's (``max_tokens``), so it says nothing of the worker's health."""

    kind = DEADLINE


class UpstreamTooLarge(UpstreamBroken):
    """A short call's answer (a metrics page) is over the size the gateway reads."""

    kind = "too_large"


MESSAGES_PATH = "/v1/messages"
"""Anthropic's Messages API: errors on this path leave in Anthropic's shape."""

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_body(message: str, status: int) -> bytes:
    """``{"type": "error", "error": {"type", "message"}}``, the type named for the status."""
    kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


class AnthropicShapedError(GatewayError):
    """A gateway error answered in Anthropic's error shape (the Messages API's clients
    raise on it by its status, as they do on Anthropic's own)."""

    def __init__(self, inner: GatewayError) -> None:
        super().__init__(
            inner.message,
            status=inner.status,
            type=inner.type,
            code=inner.code,
            param=inner.param,
            headers=inner.headers,
        )
        self.inner = inner

    def body(self) -> bytes:
        return anthropic_error_body(self.message, self.status)


def shaped_for(path: str, exc: GatewayError) -> GatewayError:
    """``exc`` in the error shape of the API at ``path`` (Anthropic's on ``/v1/messages``)."""
    if path == MESSAGES_PATH and not isinstance(exc, AnthropicShapedError):
        return AnthropicShapedError(exc)
    return exc
