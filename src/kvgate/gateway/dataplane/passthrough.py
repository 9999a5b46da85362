"""The rest of the OpenAI surface: embeddings, responses, tokenize, models, any ``/v1/`` path.

These requests are not generations the policy can read prefix blocks from, but
they go through the same proxy as chat and completions: the same routing to a
healthy worker of the requested model, the same retries before the first byte,
the same error shapes. What differs is only how their features are built:

- the model comes from the body's ``model``, else the ``model`` query
  parameter, else the one model the fleet serves (a 400 if it serves several);
  an alias is resolved to its model and the body rewritten;
- the session key is the client's (header or ``user``), except for
  ``/v1/responses`` continuing a conversation, and the paths of one stored response
  (``/v1/responses/{id}...``): there it is that response's, and every answer's id is
  bound to the worker that made it, because only that worker holds the conversation
  (vLLM keeps stored responses in its own memory), in the space of the scope that
  created it (``session_keys``): another tenant's request about it is a 404.

``GET /v1/models/{id}`` is answered by the gateway from what its fleet serves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from aiohttp.typedefs import Handler

from kvgate.core.features import RequestFeatures
from kvgate.core.prefix import (
    FeatureConfig,
    check_embedding_input,
    request_priority,
    request_tenant,
)
from kvgate.core.prefix import InvalidRequestError as BadBody
from kvgate.core.session import (
    REFUSED,
    SessionScope,
    normalize_key,
    owned,
    scope_of,
    session_key_from,
)
from kvgate.gateway.dataplane.errors import (
    GatewayError,
    InvalidPathError,
    InvalidRequestError,
    NotFoundError,
)
from kvgate.gateway.dataplane.exchange import AiohttpExchange
from kvgate.gateway.dataplane.models import check_model
from kvgate.gateway.dataplane.proxy import Forward, Proxy
from kvgate.gateway.observe.pool import WorkerPool
from kvgate.gateway.routing import Routing
from kvgate.gateway.upstream.transport import unsafe_path
from kvgate.types import SessionKey, SessionSource

RESPONSE_TAG = "response:"
"""Affinity keys of stored responses: ``response:<id>``, in its creator's space
(``core.session.owned``) unless ``session_scope`` is ``none``."""


def response_keys(
    setting: SessionScope, headers: Any, peer: str | None, max_chars: int
) -> Callable[[str], SessionKey | None]:
    """The key a response id is bound and looked up under, for a request with these
    headers from ``peer``: owned by the request's scope (``None``: a request refused a
    scope, which owns no response), or as it is under ``session_scope: none``."""
    scope = None if setting == "none" else scope_of(setting, headers, peer)

    def key_of(response_id: str) -> SessionKey | None:
        key = normalize_key(RESPONSE_TAG + response_id, max_chars)
        if key is None or setting == "none":
            return key
        return owned(key, scope) if scope != REFUSED else None

    return key_of


STORED = "/v1/responses/"
"""Paths about one stored response (``GET /v1/responses/{id}``, ``.../cancel``, ...)."""


def unknown_response(response_id: str, param: str | None) -> GatewayError:
    """What a worker answers for a response id it does not hold: the same for one another
    tenant created, so that it never learns the id exists."""
    return GatewayError(
        f"Response with id '{response_id}' not found.",
        status=404,
        type="invalid_request_error",
        code="response_not_found",
        param=param,
    )


FORWARDED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
"""Methods forwarded on ``/v1/{path}``; HEAD and OPTIONS are not (405, never upstream)."""

POST_ONLY = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
)
"""Endpoints that exist only for ``POST``: any other method is a 405 the gateway answers."""

WORKER_CONTROL = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
"""``/v1/`` paths that manage a worker rather than ask it (vLLM's runtime LoRA loading,
from any path or hub name the body gives): the operator's, on the worker itself; a
client's is a 403, never forwarded (one worker of the fleet would change)."""


ROOT_PATHS = ("/tokenize", "/detokenize")
"""vLLM's paths outside ``/v1/`` that are forwarded (to a worker of the model)."""


def confine(target: str) -> None:
    """Refuse a request target (path and query as the client sent it) that is not
    forwarded: not a normalized path (400), outside ``/v1/`` and ``ROOT_PATHS`` (404),
    a path that manages a worker (``WORKER_CONTROL``: 403). The built-in proxy's rule,
    which the endpoint picker applies too (Envoy's route may send it any path)."""
    why = unsafe_path(target)
    if why is not None:
        raise InvalidPathError(f"{why}: only normalized paths are forwarded")
    path = unquote(target.partition("?")[0])  # as the worker will read it: %5F is ``_``
    if not path.startswith("/v1/") and path not in ROOT_PATHS:
        raise NotFoundError("no route for that path: only /v1/ paths are forwarded")
    if path.rstrip("/") in WORKER_CONTROL:
        raise GatewayError(
            "that path manages a worker: it is not forwarded",
            status=403,
            type="permission_error",
            code="forbidden",
        )


def method_not_allowed(allowed: tuple[str, ...]) -> Handler:
    """A handler answering 405 with ``Allow: allowed`` (HEAD too: never sent upstream,
    where a bodiless answer would hold a worker's slot until a timeout)."""
    allow = ", ".join(allowed)

    async def refuse(request: web.Request) -> web.StreamResponse:
        raise GatewayError(
            f"{request.method} is not allowed on {request.path}; use {allow}",
            status=405,
            type="invalid_request_error",
            code="method_not_allowed",
            headers={"Allow": allow},
        )

    return refuse


@dataclass(frozen=True, slots=True)
class Keys:
    """A request's session key, and for ``/v1/responses`` its answer's (``session_keys``)."""

    key: SessionKey | None
    source: SessionSource
    answer_key: Callable[[str], SessionKey | None] | None = None
    """The key the answer's id is bound under (``None``: not bound)."""
    unknown: GatewayError | None = None
    """A continuation's answer when nothing is bound to ``key``: never forwarded then."""
    forget: bool = False
    """``DELETE /v1/responses/{id}``: ``key`` is dropped once the worker confirms (2xx)."""


def session_keys(
    cfg: FeatureConfig,
    headers: Any,
    payload: dict[str, Any] | None,
    peer: str | None,
    *,
    path: str,
    method: str = "POST",
) -> Keys:
    """The session key of a request on ``path`` that is not a generation (the proxy's and
    the picker's): the client's, or for a continuation of a stored response, or a request
    about one (``GET /v1/responses/{id}``, its ``cancel``, ...), the key of that response
    in the request's scope (``response_keys``). ``DELETE`` of the response itself
    (``forget``) drops that key once its worker confirms: the id is then unknown here too,
    not forwarded (the worker would answer 404, from the gateway's bound worker or any)."""
    key, source = session_key_from(
        headers,
        payload or {},
        header=cfg.session_header,
        use_user_field=cfg.use_user_field,
        max_chars=cfg.max_session_key_chars,
        scope=cfg.session_scope,
        peer=peer,
    )
    named: str | None = None
    param: str | None = "previous_response_id"
    forget = False
    if path.startswith(STORED):  # a stored response's own path: its owner's only
        named, slash, _ = path[len(STORED) :].partition("/")
        param, forget = None, method == "DELETE" and not slash
    elif path != "/v1/responses":
        return Keys(key, source)
    key_of = response_keys(cfg.session_scope, headers, peer, cfg.max_session_key_chars)
    answer_key = key_of if named is None else None  # else the answer names the same response
    previous = named or (payload.get("previous_response_id") if payload is not None else None)
    if previous is not None and not isinstance(previous, str):
        raise InvalidRequestError(
            "'previous_response_id' must be a string", param="previous_response_id"
        )
    if not previous:
        return Keys(key, source, answer_key)
    key = key_of(previous)
    if cfg.session_scope == "none":
        return Keys(key, SessionSource.CONTINUATION, answer_key, forget=forget)
    # Only the scope that created it continues it; a miss is the worker's own 404.
    unknown = unknown_response(previous, param)
    if key is None:
        raise unknown
    return Keys(key, SessionSource.CONTINUATION, answer_key, unknown, forget)


class Passthrough:
    """Handlers for the non-generation endpoints, each forwarded through ``Proxy``."""

    def __init__(
        self,
        proxy: Proxy,
        pool: WorkerPool,
        features: FeatureConfig,
        routing: Routing,
    ) -> None:
        self.proxy = proxy
        self.pool = pool
        self.features = features
        self.routing = routing
        """The routing state in force (its ``aliases``)."""

    def routes(self) -> list[web.AbstractRouteDef]:
        """The routes, to add after the specific ``/v1/`` ones."""
        post_only = method_not_allowed(("POST",))
        get_only = method_not_allowed(("GET", "HEAD"))  # the model list: the gateway's own
        return [
            web.get("/v1/models/{model:.+}", self.model_card),
            web.post("/v1/embeddings", self.embeddings),
            web.post("/v1/responses", self.responses),
            web.post("/tokenize", self.tokenize),
            web.post("/detokenize", self.detokenize),
            # After each path's own routes: every other method there is a 405.
            *(web.route("*", path, post_only) for path in POST_ONLY),
            web.route("*", "/v1/models", get_only),
            web.route("*", "/v1/models/{model:.+}", get_only),
            web.get("/v1/{path:.*}", self.any_v1, allow_head=False),
            *(web.route(m, "/v1/{path:.*}", self.any_v1) for m in FORWARDED_METHODS[1:]),
            web.route("*", "/v1/{path:.*}", method_not_allowed(FORWARDED_METHODS)),
        ]

    async def model_card(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{id}``: the model (or alias) as the fleet serves it."""
        name = request.match_info["model"]
        target = self.routing.state.aliases.get(name, name)
        check_model(self.pool, target)
        card: dict[str, Any] = {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "kvgate",
            "versions": self.pool.models().get(target, []),
        }
        if target != name:
            card["alias_of"] = target
        return web.json_response(card)

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/embeddings``."""
        return await self._forward(request, "/v1/embeddings", embeddings=True)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/responses``: continuations go to the worker that holds the conversation."""
        return await self._forward(request, "/v1/responses")

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        """``POST /tokenize`` (vLLM's)."""
        return await self._forward(request, "/tokenize")

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        """``POST /detokenize`` (vLLM's)."""
        return await self._forward(request, "/detokenize")

    async def any_v1(self, request: web.Request) -> web.StreamResponse:
        """Any other ``/v1/`` path: forwarded to a worker of the requested model, as the
        client sent it (``middleware.paths`` refused it unless it is a normalized path)."""
        target = request.raw_path
        confine(target)
        return await self._forward(request, target)

    async def _forward(
        self,
        request: web.Request,
        path: str,
        *,
        embeddings: bool = False,
    ) -> web.StreamResponse:
        def describe(body: bytes, request_id: str) -> Forward:
            return self.describe(body, request, request_id, embeddings=embeddings)

        exchange = AiohttpExchange(request)
        await self.proxy.handle(exchange, path, "completions", describe=describe)
        return exchange.result()

    def describe(
        self,
        body: bytes,
        request: web.Request,
        request_id: str,
        *,
        embeddings: bool = False,
    ) -> Forward:
        """The features and body to forward for one request (400/404/503 on a bad one)."""
        payload: dict[str, Any] | None = None
        if body:
            try:
                decoded = json.loads(body)
            except ValueError:
                raise InvalidRequestError("the request body is not valid JSON") from None
            if not isinstance(decoded, dict):
                raise InvalidRequestError("the request body must be a JSON object")
            payload = decoded
        if embeddings:
            _check_embeddings(payload)
        model = self._model(payload, request)
        target = self.routing.state.aliases.get(model, model)
        if payload is not None and target != model:
            payload["model"] = target
            body = json.dumps(payload, separators=(",", ":")).encode()
        check_model(self.pool, target)
        keys = session_keys(
            self.features,
            request.headers,
            payload,
            request.remote,
            path=request.path,
            method=request.method,
        )
        stream = payload.get("stream", False) if payload is not None else False
        features = RequestFeatures(
            request_id=request_id,
            model=target,
            session_key=keys.key,
            session_source=keys.source,
            priority=request_priority(request.headers, self.features, request.remote),
            stream=stream is True,
            tenant=request_tenant(keys.key, request.headers, self.features, request.remote),
        )
        return Forward(
            features,
            body,
            method=request.method,
            answer_key=keys.answer_key,
            unknown=keys.unknown,
            forget=keys.key if keys.forget else None,
        )

    def _model(self, payload: dict[str, Any] | None, request: web.Request) -> str:
        model = payload.get("model") if payload is not None else None
        if model is None:
            model = request.query.get("model")
        if model is None:
            served = list(self.pool.models())
            if len(served) == 1:
                return served[0]
            raise InvalidRequestError(
                "'model' is required (the fleet serves several models)", param="model"
            )
        if not isinstance(model, str) or not model:
            raise InvalidRequestError("'model' must be a non-empty string", param="model")
        return model


def _check_embeddings(payload: dict[str, Any] | None) -> None:
    """400 for an embeddings ``input`` no engine takes (as completions' ``prompt``)."""
    if payload is None or "input" not in payload:
        raise InvalidRequestError("'input' is required", param="input")
    try:
        check_embedding_input(payload["input"])
    except BadBody as exc:
        raise InvalidRequestError(exc.message, param=exc.param) from None
