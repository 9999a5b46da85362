"""``POST /admin/reload`` across every server process: all of them reload, or it says which not.

With ``--processes N`` the kernel hands the admin request to one process; a reload
there alone would leave the others on the old configuration (an alias on some
requests only, a rotated-out admin token still accepted by the rest). So the
process that took it:

1. reads and checks the new configuration (``Reloader.read``, ``Reloader.check``):
   a refusal is the answer (409 naming what was refused), and nothing is applied in
   any process;
2. reloads itself and asks every sibling to reload (``POST /reload`` on the
   sibling's Unix socket, ``observe.federation``), all at once, each re-reading the
   same file;
3. answers 200 with what changed and ``processes``, one entry per process
   (``reloaded``, or ``refused`` with the reason), when every process reloaded;
   otherwise 503 ``reload_incomplete`` in the OpenAI error shape, naming the
   processes that did not (refused, or no answer within ``SIBLING_TIMEOUT_S``),
   with the same ``processes`` list beside the error.

``SIGHUP`` reaches every process already (the parent passes it on).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Handler

from kvgate.gateway.dataplane.errors import GatewayError

if TYPE_CHECKING:
    from kvgate.gateway.app import Gateway

SIBLING_TIMEOUT_S = 30.0
"""How long a sibling may take to reload (new workers are probed first) before it
counts as not reached."""


async def reload_everywhere(gateway: Gateway) -> web.Response:
    """Reload this process and its siblings (see the module docs); the admin answer."""
    reloader, peers = gateway.reloader, gateway.peers
    if peers is None or peers.count <= 1:
        result = await reloader.reload_source()
        return web.json_response(result.to_dict())
    reloader.check(reloader.read())  # refused: nothing applied anywhere
    own, others = await asyncio.gather(
        reload_here(gateway), peers.ask_siblings("/reload", SIBLING_TIMEOUT_S)
    )
    processes = [{"process": peers.index, **own}]
    for index, answer in sorted(others.items()):
        processes.append({"process": index, **_sibling(answer)})
    missed = [p for p in processes if p["status"] != "reloaded"]
    if not missed:
        return web.json_response({**_changes(own), "processes": processes})
    named = ", ".join(f"process {p['process']} {p['status']}" for p in missed)
    error = GatewayError(
        f"reload incomplete: {named}; {len(processes) - len(missed)} of "
        f"{len(processes)} processes reloaded (POST /admin/reload again, or SIGHUP the gateway)",
        status=503,
        code="reload_incomplete",
    )
    body = json.loads(error.body())
    return web.json_response({**body, "processes": processes}, status=error.status)


async def reload_here(gateway: Gateway) -> dict[str, Any]:
    """Reload this process: its entry in ``processes``."""
    try:
        result = await gateway.reloader.reload_source()
    except GatewayError as exc:
        return {"pid": os.getpid(), "status": "refused", "error": exc.message}
    return {"pid": os.getpid(), "status": "reloaded", **result.to_dict()}


def sibling_handler(gateway: Gateway) -> Handler:
    """The ``POST /reload`` handler a process serves its siblings on its Unix socket."""

    async def reload(request: web.Request) -> web.Response:
        return web.json_response(await reload_here(gateway))

    return reload


def _sibling(answer: tuple[int, bytes] | None) -> dict[str, Any]:
    if answer is None:
        return {"status": "unreachable"}
    status, body = answer
    try:
        found = json.loads(body)
    except ValueError:
        found = None
    if status != 200 or not isinstance(found, dict) or "status" not in found:
        return {"status": "failed", "error": f"answered {status}"}
    return found


def _changes(own: dict[str, Any]) -> dict[str, Any]:
    return {k: own[k] for k in ("changed", "workers_added", "workers_removed") if k in own}
