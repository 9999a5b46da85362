"""The operator's page: what the router sees, served by the gateway itself.

- ``GET /``: redirects to ``/dashboard``
- ``GET /dashboard``: one static HTML page (with its script and style under
  ``/dashboard/static/``) shipped as package data: no build step, nothing fetched
  from the internet. It holds no data of its own.
- ``GET /dashboard/state.json``: everything the page shows, as one JSON object.
  An admin route like any other: behind the admin API's one guard
  (``routes.check_admin``: ``Authorization: Bearer <admin_token>`` when
  ``admin_token`` is set, which the page asks for once and keeps in the tab's
  sessionStorage; else loopback only).

The dashboard is part of the admin API and mounted with it (``routes.setup_admin``):
with ``admin.enabled: false`` none of its paths exists (404).

The page refreshes itself by polling the state. The state is built from the
same sources as ``/metrics`` (the pool's gauge rows and the metric registry's
samples), so what the page says and what Prometheus scrapes agree; the recent
traffic comes from the gateway's ``TrafficWindow``.
"""

from __future__ import annotations

import importlib.resources
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kvgate.core.pressure import PressureConfig
from kvgate.gateway.admin.routes import AdminRoute
from kvgate.gateway.dataplane.errors import NotFoundError
from kvgate.gateway.observe.metrics import WorkerGaugeRow

if TYPE_CHECKING:
    from kvgate.gateway.app import Gateway

_STATIC = {
    "dashboard.js": "application/javascript",
    "dashboard.css": "text/css",
}

_RECENT_MOVES = 20
_HISTORY_SHOWN = 20


def _asset(name: str) -> bytes:
    return importlib.resources.files("kvgate.gateway.admin").joinpath("static", name).read_bytes()


def hot_because(row: WorkerGaugeRow, pressure: PressureConfig) -> list[str]:
    """Why a worker is hot or out, in words, worst first (empty: nothing to say).

    The same thresholds routing uses: the pressure watermarks and temperature
    limits, a full in-flight limit, a waiting queue, stale or missing signals.
    """
    why: list[str] = []
    if row.health in ("ejected", "draining"):
        why.append(row.health)
    if row.pressure != "normal":
        why.append(f"pressure {row.pressure}")
    if row.kv_usage is not None and row.kv_usage >= pressure.soft_watermark:
        mark = "hard" if row.kv_usage >= pressure.hard_watermark else "soft"
        why.append(f"KV {row.kv_usage:.0%} ≥ {mark} {_mark(pressure, mark):.0%}")
    if row.gpu_temp_c is not None and row.gpu_temp_c >= pressure.temp_soft_c:
        why.append(f"GPU {row.gpu_temp_c:.0f}°C ≥ {pressure.temp_soft_c:.0f}°C")
    if row.max_in_flight and row.in_flight >= row.max_in_flight:
        why.append(f"full: {row.in_flight}/{row.max_in_flight} in flight")
    if row.waiting:
        why.append(f"{row.waiting} waiting")
    if not row.signals_fresh and row.health not in ("ejected", "draining"):
        why.append("signals stale" if row.scrape_age_s is not None else "never scraped")
    return why


def _mark(pressure: PressureConfig, which: str) -> float:
    return pressure.hard_watermark if which == "hard" else pressure.soft_watermark


def samples_by(
    families: Iterable[Any], name: str, labels: tuple[str, ...]
) -> dict[tuple[str, ...], float]:
    """Sum of the samples named ``name`` grouped by ``labels`` (a metric's value as scraped)."""
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for family in families:
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sample.labels.get(k, "") for k in labels)] += sample.value
    return dict(out)


def _keyed(values: Mapping[tuple[str, ...], float]) -> list[dict[str, Any]]:
    return [{"labels": list(k), "value": v} for k, v in sorted(values.items())]


class Dashboard:
    """The dashboard's routes over one ``Gateway``."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.started_at = time.time()

    def pages(self) -> list[web.RouteDef]:
        """The page, its assets and ``/``: no data of the gateway's in them."""
        return [
            web.get("/", self.root),
            web.get("/dashboard", self.page),
            web.get("/dashboard/static/{name}", self.static),
        ]

    def admin_routes(self) -> list[AdminRoute]:
        """The page's data: an admin route, behind the admin API's guard."""
        return [("GET", "/dashboard/state.json", self.state)]

    async def root(self, request: web.Request) -> web.StreamResponse:
        """``GET /``: the dashboard."""
        raise web.HTTPFound("/dashboard")

    async def page(self, request: web.Request) -> web.Response:
        """``GET /dashboard``: the page (it reads its data from ``state.json``)."""
        return web.Response(
            body=_asset("dashboard.html"),
            content_type="text/html",
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def static(self, request: web.Request) -> web.Response:
        """``GET /dashboard/static/{name}``: the page's script and style."""
        name = request.match_info["name"]
        kind = _STATIC.get(name)
        if kind is None:
            raise NotFoundError(f"no dashboard asset {name!r}")
        return web.Response(
            body=_asset(name),
            content_type=kind,
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def state(self, request: web.Request) -> web.Response:
        """``GET /dashboard/state.json``: everything the page shows."""
        return web.json_response(await self.snapshot(), headers={"Cache-Control": "no-store"})

    async def snapshot(self) -> dict[str, Any]:
        """The dashboard's state: fleet, traffic, sessions, shedding, migrations, rollouts."""
        gw = self.gateway
        now = time.time()
        families = list(gw.metrics.registry.collect())
        rows = gw.pool.gauge_rows(time.monotonic())
        affinities = await self._affinities()
        pressure = gw.config.pressure
        speeds = gw.policy.speeds()
        workers = []
        for row in rows:
            learned = speeds.get(row.worker)
            workers.append(
                {
                    "id": row.worker,
                    "model": row.model,
                    "version": row.version,
                    "health": row.health,
                    "in_flight": row.in_flight,
                    "max_in_flight": row.max_in_flight,
                    "running": row.running,
                    "waiting": row.waiting,
                    "kv_usage": row.kv_usage,
                    "kv_in_flight_tokens": row.kv_in_flight_tokens,
                    "kv_capacity_tokens": row.kv_capacity_tokens,
                    "pressure": row.pressure,
                    "gpu_temp_c": row.gpu_temp_c,
                    "gpu_mem_used_mib": row.gpu_mem_used_mib,
                    "gpu_mem_total_mib": row.gpu_mem_total_mib,
                    "scrape_age_s": row.scrape_age_s,
                    "signals_fresh": row.signals_fresh,
                    "affinities": affinities.get(row.worker) if affinities is not None else None,
                    "hot": hot_because(row, pressure),
                    # What routing learned of its speed (``core.speed``); None: nothing yet.
                    "prefill_tokens_per_s": 1.0 / learned.speed.prefill_s if learned else None,
                    "overhead_s": learned.speed.overhead_s if learned else None,
                    "ttft_error": learned.ttft_error if learned else None,
                }
            )
        traffic = gw.traffic
        minute = traffic.total(now, 60.0)
        rollouts = []
        for status in gw.control.rollouts.statuses():
            history = list(gw.control.rollouts.history.get(status["rollout"], ()))
            rollouts.append({**status, "history": history[-_HISTORY_SHOWN:]})
        moves = [
            {
                "session": m.session_key,
                "from": m.from_worker,
                "to": m.to_worker,
                "reason": m.reason,
                "offloaded": m.offloaded,
            }
            for m in list(gw.pressure.moves)[-_RECENT_MOVES:]
        ]
        return {
            "now": now,
            "uptime_s": now - self.started_at,
            "policy": gw.config.policy.name,
            "draining": gw.draining,
            "in_flight": gw.proxy.in_flight,
            "queued": len(gw.queue),
            "thresholds": {
                "kv_soft": pressure.soft_watermark,
                "kv_hard": pressure.hard_watermark,
                "temp_soft_c": pressure.temp_soft_c,
                "temp_drain_c": pressure.temp_drain_c,
            },
            "workers": workers,
            "traffic": {
                "bucket_s": traffic.bucket_s,
                "buckets": [b.to_dict() for b in traffic.buckets(now)],
                "last_minute": minute.to_dict(),
            },
            "sessions": {
                "affinities": sum(affinities.values()) if affinities is not None else None,
                "lookups": _keyed(
                    samples_by(families, "kvgate_affinity_lookups_total", ("result",))
                ),
            },
            "totals": {
                "requests": sum(samples_by(families, "kvgate_requests_total", ()).values()),
                "decisions": _keyed(
                    samples_by(families, "kvgate_route_decisions_total", ("reason",))
                ),
                "sheds": _keyed(samples_by(families, "kvgate_shed_total", ("reason", "priority"))),
                "migrations": _keyed(
                    samples_by(families, "kvgate_migrations_total", ("worker", "reason"))
                ),
                "sessions_moved": _keyed(
                    samples_by(families, "kvgate_sessions_moved_total", ("worker", "reason"))
                ),
                "offloads": _keyed(
                    samples_by(families, "kvgate_offloads_total", ("worker", "result"))
                ),
                "drains": _keyed(samples_by(families, "kvgate_worker_drains_total", ("cause",))),
            },
            "recent_moves": moves,
            "models": gw.control.versions.describe(),
            "rollouts": rollouts,
        }

    async def _affinities(self) -> dict[str, int] | None:
        """Affinities held per worker, from the store (``None`` while the store fails)."""
        try:
            found = await self.gateway.store.counts()
        except Exception:
            return None
        return {str(k): int(v) for k, v in found.items()}
