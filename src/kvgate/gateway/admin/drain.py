"""Draining a worker by hand, and what pressure looks like, through the admin API.

- ``POST /admin/workers/{id}/drain``: the worker takes no new sessions and no
  new requests; requests in flight finish. Its affine sessions move as they next
  arrive (policies treat a draining worker's sessions as lost and rebind them).
- ``POST /admin/workers/{id}/undrain``: it takes traffic again. A drain the GPU's
  temperature calls for stays until the GPU cools, whatever the admin says.
- ``GET /admin/pressure``: every worker's pressure level, drain causes, seconds
  at or above each watermark, and the latest session moves.

``{id}`` is the worker's id (its URL), its ``host:port``, or its index in the
configuration; a URL's ``/`` may be sent percent-encoded. The routes are
mounted with the rest of the admin API (``routes.setup_admin``), behind its
guard, and only when it is enabled.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

from aiohttp import web

from kvgate.core.fleet import Pressure
from kvgate.gateway.control.pressure import PressureDriver
from kvgate.gateway.dataplane.errors import NotFoundError
from kvgate.gateway.observe.pool import Worker, WorkerPool

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class DrainApi:
    """The drain and pressure admin endpoints of one gateway."""

    def __init__(self, pool: WorkerPool, driver: PressureDriver) -> None:
        self.pool = pool
        self.driver = driver

    def routes(self) -> list[tuple[str, str, _Handler]]:
        """``(method, path, handler)`` for ``routes.setup_admin`` to mount behind its guard."""
        return [
            ("POST", r"/admin/workers/{id:.+}/drain", self.drain),
            ("POST", r"/admin/workers/{id:.+}/undrain", self.undrain),
            ("GET", "/admin/pressure", self.status),
        ]

    async def drain(self, request: web.Request) -> web.Response:
        """``POST /admin/workers/{id}/drain``."""
        return await self._set(request, True)

    async def undrain(self, request: web.Request) -> web.Response:
        """``POST /admin/workers/{id}/undrain``."""
        return await self._set(request, False)

    async def status(self, request: web.Request) -> web.Response:
        """``GET /admin/pressure``."""
        now = time.monotonic()
        tracker = self.driver.tracker
        workers = [
            {
                "worker": w.id,
                "pressure": w.pressure.value,
                "draining": w.draining,
                "drained_by_admin": w.id in self.driver.admin_drained,
                "too_hot": tracker.draining(w.id),
                "soft_seconds": round(tracker.time_above(w.id, Pressure.SOFT, now), 3),
                "hard_seconds": round(tracker.time_above(w.id, Pressure.HARD, now), 3),
            }
            for w in self.pool
        ]
        moves = [
            {
                "session": m.session_key,
                "from": m.from_worker,
                "to": m.to_worker,
                "reason": m.reason,
                "offloaded": m.offloaded,
            }
            for m in list(self.driver.moves)[-100:]
        ]
        return web.json_response({"workers": workers, "recent_moves": moves})

    async def _set(self, request: web.Request, drain: bool) -> web.Response:
        worker = self.find(request.match_info["id"])
        changed = self.driver.set_admin_drain(worker, drain)
        return web.json_response(
            {
                "worker": worker.id,
                "draining": worker.draining,
                "drained_by_admin": worker.id in self.driver.admin_drained,
                "changed": changed,
                "in_flight": worker.in_flight,
            }
        )

    def find(self, ref: str) -> Worker:
        """The worker ``ref`` names (id, ``host:port`` or index); ``NotFoundError`` if none."""
        ref = unquote(ref).rstrip("/")
        worker = self.pool.get(ref)
        if worker is not None:
            return worker
        for candidate in self.pool:
            if candidate.id.split("://", 1)[-1] == ref:
                return candidate
        if ref.isdigit():
            workers = list(self.pool)
            if int(ref) < len(workers):
                return workers[int(ref)]
        raise NotFoundError(f"no worker {ref!r}")
