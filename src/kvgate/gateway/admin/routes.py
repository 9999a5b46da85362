"""The admin API: model versions, weights, workers and rollouts, behind a bearer token.

Every admin route, the drain routes (``admin.drain``) included, passes one
guard (``check_admin``): ``Authorization: Bearer <admin_token>`` when a token is
configured, else the request must come from a loopback address (the gateway
does not start with the admin API on a non-loopback address without a token) and
from this machine's own clients (``_local``): not relayed by a proxy on it (a
forwarding header), not a browser page of another origin (``Origin``,
``Sec-Fetch-Site``: a page any site serves could POST a worker of its own to
``127.0.0.1``), not a name that was rebound to loopback (``Host``).
With ``admin.enabled: false`` no admin route is mounted at all (404). Errors use
the OpenAI shape: a bad body is 400 naming
the field (``param``), an unknown rollout, model, version or worker 404, an
action the current state forbids 409.

    GET    /admin/models                               versions, weights, workers
    PUT    /admin/models/{model}/weights               {"weights": {"v2": 90, "v3": 10}}
    POST   /admin/models/{model}/versions              {"version": "v3", "weight": 0}
    DELETE /admin/models/{model}/versions/{version}
    POST   /admin/models/{model}/stable                {"version": "v3"}
    GET    /admin/workers
    POST   /admin/workers                              a worker config: {"url": ..., ...};
                                                       saved in the store: kept over restarts
    DELETE /admin/workers?url=URL[&wait=true]          stop routing; in-flight finish
    GET    /admin/rollouts
    POST   /admin/rollouts                             a RolloutSpec; starts it (201)
    GET    /admin/rollouts/{id}
    POST   /admin/rollouts/{id}/pause|resume|promote|abort  (promote?step=true: one step)

Other parts give ``setup_admin`` their own admin routes; they get the same guard.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvgate.core.rollout import RolloutSpec
from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.control.plane import ControlPlane
from kvgate.gateway.control.rollouts import ACTIONS, RolloutConflictError
from kvgate.gateway.dataplane.errors import (
    GatewayError,
    InvalidRequestError,
    NotFoundError,
    UnauthorizedError,
)
from kvgate.redaction import without_userinfo

_M = TypeVar("_M", bound=BaseModel)

ADMIN_KEY = web.AppKey("kvgate.admin", ControlPlane)
"""Where ``setup_admin`` leaves the control plane; its presence enables admin routes."""


AdminRoute = tuple[str, str, Handler]
"""``(method, path, handler)`` of one admin route."""


def check_admin(request: web.Request) -> ControlPlane:
    """The control plane, once the request is authorised (401/403 if not; 404 if disabled)."""
    control = request.app.get(ADMIN_KEY)
    if control is None:
        raise NotFoundError(f"no route for {request.method} {request.path}")
    token = control.admin_token
    if token is None:
        if not _loopback(request.remote) or not _local(request):
            raise GatewayError(
                "the admin API answers only on loopback unless admin_token is set",
                status=403,
                type="permission_error",
                code="forbidden",
            )
        return control
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), token.encode()
    ):
        raise UnauthorizedError(
            "the admin API needs 'Authorization: Bearer <admin_token>'",
            code="invalid_admin_token",
        )
    return control


def _loopback(remote: str | None) -> bool:
    if remote is None:
        return False
    try:
        return ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


_FORWARDING = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-real-ip", "via")
"""Headers a proxy adds: a request carrying one came through it, from anywhere."""


def _local(request: web.Request) -> bool:
    """True when a loopback peer's request is this machine's own client's: no proxy's
    forwarding header, a loopback ``Host`` (a DNS-rebound name is not), and no other
    origin's browser page (``Origin`` and ``Sec-Fetch-Site``)."""
    headers = request.headers
    if any(name in headers for name in _FORWARDING):
        return False
    host = headers.get("Host")
    if host is not None and not _loopback_host(host):
        return False
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = headers.get("Origin")
    if origin is not None:
        scheme, _, authority = origin.partition("://")
        if scheme not in ("http", "https") or authority != host:
            return False
    return True


def _loopback_host(host: str) -> bool:
    """True for ``localhost``, ``127.0.0.1:8000``, ``[::1]:8000`` and the like."""
    if host.startswith("["):
        name = host.partition("]")[0].removeprefix("[")
    else:
        name = host.partition(":")[0]
    return name.lower() in ("localhost", "localhost.") or _loopback(name)


def add_admin_route(app: web.Application, method: str, path: str, handler: Handler) -> None:
    """Register an admin route; the handler runs only for an authorised request."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        check_admin(request)
        return await handler(request)

    guarded.__doc__ = handler.__doc__
    app.router.add_route(method, path, guarded)


class _WeightsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weights: dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = Field(min_length=1)


class _VersionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(min_length=1)
    weight: float = Field(default=0.0, ge=0)


class _StableBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(min_length=1)


def invalid(exc: ValidationError, prefix: str = "") -> InvalidRequestError:
    """A 400 naming the first invalid field of a body."""
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "(body)"
    msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
    return InvalidRequestError(f"{prefix}{field}: {msg}", param=field)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = json.loads(await request.read() or b"null")
    except ValueError:
        raise InvalidRequestError("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return data


def _parse(kind: type[_M], data: Mapping[str, Any]) -> _M:
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise invalid(exc) from None


def _json(data: object, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


# -- models and versions ----------------------------------------------------------


async def get_models(request: web.Request) -> web.Response:
    """``GET /admin/models``: every model's versions, weights, stable version, workers."""
    return _json({"models": check_admin(request).versions.describe()})


def _no_rollout(control: ControlPlane, model: str) -> None:
    active = control.rollouts.active_for(model)
    if active is not None:
        raise RolloutConflictError(
            f"rollout {active.spec.rollout_id} controls the weights of {model!r}; "
            "pause, promote or abort it first",
        )


async def put_weights(request: web.Request) -> web.Response:
    """``PUT /admin/models/{model}/weights``: change some versions' weights."""
    control = check_admin(request)
    model = request.match_info["model"]
    body = _parse(_WeightsBody, await _body(request))
    _no_rollout(control, model)
    versions = control.versions.set_weights(model, body.weights)
    await control.rollouts.publish_model(model)
    return _json(versions.to_dict())


async def post_version(request: web.Request) -> web.Response:
    """``POST /admin/models/{model}/versions``: register a version (weight 0 by default)."""
    control = check_admin(request)
    model = request.match_info["model"]
    body = _parse(_VersionBody, await _body(request))
    if body.weight:
        _no_rollout(control, model)
    versions = control.versions.add_version(model, body.version, body.weight)
    await control.rollouts.publish_model(model)
    return _json(versions.to_dict(), status=201)


async def delete_version(request: web.Request) -> web.Response:
    """``DELETE /admin/models/{model}/versions/{version}``: forget a version."""
    control = check_admin(request)
    model, version = request.match_info["model"], request.match_info["version"]
    active = control.rollouts.active_for(model)
    if active is not None and version in (active.spec.baseline, active.spec.canary):
        raise RolloutConflictError(f"version {version!r} is in rollout {active.spec.rollout_id}")
    versions = control.versions.remove_version(model, version)
    await control.rollouts.publish_model(model)
    return _json(versions.to_dict())


async def post_stable(request: web.Request) -> web.Response:
    """``POST /admin/models/{model}/stable``: mark a version stable."""
    control = check_admin(request)
    model = request.match_info["model"]
    body = _parse(_StableBody, await _body(request))
    _no_rollout(control, model)
    versions = control.versions.set_stable(model, body.version)
    await control.rollouts.publish_model(model)
    return _json(versions.to_dict())


# -- workers ---------------------------------------------------------------------


def _worker_view(control: ControlPlane) -> list[dict[str, Any]]:
    pool = control.membership.pool
    now = time.monotonic()
    return [
        {
            "url": w.id,
            "model": w.model,
            "version": w.version,
            "health": w.health(now, pool.stale_after).value,
            "in_flight": w.in_flight,
        }
        for w in pool
    ]


async def get_workers(request: web.Request) -> web.Response:
    """``GET /admin/workers``: every worker, its version, health and load."""
    return _json({"workers": _worker_view(check_admin(request))})


async def post_worker(request: web.Request) -> web.Response:
    """``POST /admin/workers``: add a worker (probed before it takes traffic)."""
    control = check_admin(request)
    config = _parse(WorkerConfig, await _body(request))
    worker = await control.add_worker(config)
    return _json(
        {"url": worker.id, "model": worker.model, "version": worker.version, "up": worker.probe_ok},
        status=201,
    )


async def delete_worker(request: web.Request) -> web.Response:
    """``DELETE /admin/workers?url=URL``: stop routing to a worker; in-flight requests finish."""
    control = check_admin(request)
    url = request.query.get("url")
    if not url:
        raise InvalidRequestError("give the worker's url as ?url=", param="url")
    wait = request.query.get("wait", "").lower() in ("1", "true", "yes")
    worker = await control.remove_worker(without_userinfo(url.rstrip("/")), wait=wait)
    return _json({"url": worker.id, "removed": True, "in_flight": worker.in_flight})


# -- rollouts --------------------------------------------------------------------


async def get_rollouts(request: web.Request) -> web.Response:
    """``GET /admin/rollouts``: every known rollout's status."""
    return _json({"rollouts": check_admin(request).rollouts.statuses()})


async def post_rollout(request: web.Request) -> web.Response:
    """``POST /admin/rollouts``: start a rollout (201 with its status)."""
    control = check_admin(request)
    data = await _body(request)
    try:
        spec = RolloutSpec.model_validate(data)
    except ValidationError as exc:
        raise invalid(exc) from None
    return _json(await control.rollouts.create(spec), status=201)


async def get_rollout(request: web.Request) -> web.Response:
    """``GET /admin/rollouts/{id}``: one rollout's state, step, weights and gates."""
    control = check_admin(request)
    return _json(await control.rollouts.status(request.match_info["id"]))


async def post_action(request: web.Request) -> web.Response:
    """``POST /admin/rollouts/{id}/{action}``: pause, resume, promote or abort."""
    control = check_admin(request)
    rollout_id, action = request.match_info["id"], request.match_info["action"]
    one_step = request.query.get("step", "").lower() in ("1", "true", "yes")
    return _json(await control.rollouts.act(rollout_id, action, full=not one_step))


def setup_admin(
    app: web.Application,
    control: ControlPlane,
    extra: Sequence[AdminRoute] = (),
    pages: Sequence[web.RouteDef] = (),
) -> None:
    """Enable the admin API on ``app``: its routes and ``extra`` ones, all behind one guard,
    and ``pages`` (the dashboard's page and assets, which hold no data) beside them: one
    mount, so with the admin API disabled none of them exists."""
    app[ADMIN_KEY] = control
    app.add_routes(pages)
    actions = "|".join(ACTIONS)
    routes: list[AdminRoute] = [
        ("GET", "/admin/models", get_models),
        ("PUT", "/admin/models/{model:.+}/weights", put_weights),
        ("POST", "/admin/models/{model:.+}/versions", post_version),
        ("DELETE", "/admin/models/{model:.+}/versions/{version}", delete_version),
        ("POST", "/admin/models/{model:.+}/stable", post_stable),
        ("GET", "/admin/workers", get_workers),
        ("POST", "/admin/workers", post_worker),
        ("DELETE", "/admin/workers", delete_worker),
        ("GET", "/admin/rollouts", get_rollouts),
        ("POST", "/admin/rollouts", post_rollout),
        ("POST", f"/admin/rollouts/{{id:.+}}/{{action:{actions}}}", post_action),
        ("GET", "/admin/rollouts/{id:.+}", get_rollout),
    ]
    for method, path, handler in [*routes, *extra]:
        add_admin_route(app, method, path, handler)
