"""One gateway: its parts wired together, and the aiohttp application that serves it.

``Gateway`` owns the worker pool, the policy (built by name from the registry,
so an unknown name fails here, at start-up), the store, the router, the health
checker and the metrics. ``build_app`` puts it behind the HTTP endpoints:

- ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/messages``
  (Anthropic's Messages API): routed and forwarded
- ``GET /v1/models``: the models the fleet serves
- ``GET /healthz``: the process is alive
- ``GET /readyz`` (and ``/health``, as vLLM names it): a routable worker exists and the
  gateway is not draining
- ``GET /metrics``: the gateway's own Prometheus metrics
- ``GET /dashboard`` (and ``/``): the operator's page (``admin/dashboard.py``), mounted
  with the admin API and behind its guard
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from kvgate.core.policies import default_registry
from kvgate.core.policy import Policy
from kvgate.core.registry import PolicyRegistry
from kvgate.core.route import RouteConfig
from kvgate.gateway.admin.dashboard import Dashboard
from kvgate.gateway.admin.drain import DrainApi
from kvgate.gateway.admin.routes import setup_admin
from kvgate.gateway.apikeys import key_names, unchecked_tenants
from kvgate.gateway.config import GatewayConfig
from kvgate.gateway.control.offload import SlotPlane
from kvgate.gateway.control.peers import PeerLoads
from kvgate.gateway.control.plane import ControlPlane
from kvgate.gateway.control.pressure import PressureDriver
from kvgate.gateway.control.reload import Reloader
from kvgate.gateway.control.toolcalls import ToolCallPlane
from kvgate.gateway.dataplane import middleware
from kvgate.gateway.dataplane.connection import ConnectionLimits, GuardedAppRunner, GuardedServer
from kvgate.gateway.dataplane.listener import DataPlane, DataPlaneLimits
from kvgate.gateway.dataplane.models import models_payload
from kvgate.gateway.dataplane.passthrough import Passthrough
from kvgate.gateway.dataplane.proxy import Proxy
from kvgate.gateway.dataplane.queue import AdmissionQueue
from kvgate.gateway.dataplane.retry import RetryBudget
from kvgate.gateway.dataplane.router import Router
from kvgate.gateway.dataplane.warmups import WarmUps
from kvgate.gateway.observe.federation import MetricsPeers
from kvgate.gateway.observe.health import HealthChecker
from kvgate.gateway.observe.kvcache import EngineCaches, KVEventsCollector
from kvgate.gateway.observe.logs import AccessLog
from kvgate.gateway.observe.metrics import CONTENT_TYPE, GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.observe.traffic import TrafficWindow
from kvgate.gateway.reloads import reload_everywhere
from kvgate.gateway.routing import Routing
from kvgate.gateway.upstream.transport import Timeouts, Upstream
from kvgate.store import open_store
from kvgate.store.base import AffinityStore
from kvgate.tokens.models import Tokenizers

log = logging.getLogger("kvgate.gateway")


class Gateway:
    """Every part of one gateway process, and its lifecycle (start, drain, stop)."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        registry: PolicyRegistry | None = None,
        policy: Policy | None = None,
        store: AffinityStore | None = None,
        source: Callable[[], GatewayConfig] | None = None,
    ) -> None:
        self.config = config
        self.registry = registry or default_registry()
        """The policies this gateway builds from (a reload rebuilds its policy here too)."""
        self.routing = Routing.of(
            policy or self.registry.build(config.policy.name, config.policy_options(self.registry)),
            config.model_aliases,
        )
        """The routing state in force (policy, aliases): one value a reload replaces whole."""
        self._owns_store = store is None
        if store is None:
            store = open_store(config.store.effective_url, **config.store.backend_options())
        self.store = store
        self.queue = AdmissionQueue(config.admission.queue_size)
        t = config.timeouts
        timeouts = Timeouts(connect=t.connect_s, first_byte=t.first_byte_s, total=t.total_s)
        default_max = config.admission.worker_max_in_flight
        workers = [Worker(wc, Upstream(wc.url, timeouts), default_max) for wc in config.workers]
        pressure = config.pressure
        # With pressure on, the pool counts what is sent between scrapes (new sessions
        # leave a worker about to fill) and, with ``kv_gate``, the router holds
        # requests for KV headroom instead of sending them to be preempted.
        self.pool = WorkerPool(
            workers,
            config.health.stale_after,
            self.queue,
            pressure=pressure if pressure.enabled else None,
        )
        self.peer_loads = PeerLoads(self.pool, store)
        """The other replicas' in-flight counts, through the store (``core.peers``)."""
        self.metrics = GatewayMetrics(
            lambda: self.pool.gauge_rows(time.monotonic()), created=config.metrics_created
        )
        self.traffic = TrafficWindow()
        """The last minutes of traffic by route reason and worker, for the dashboard."""
        self.metrics.watch_store(self.store.health)
        self.metrics.watch_speeds(self.policy.speeds)
        self.slots = SlotPlane(
            config.slots,
            self.metrics.slots,
            wait_limit_s=t.total_s,
            store=self.store,
            features=config.features,
        )
        self.pressure = PressureDriver(
            self.pool,
            self.store,
            self.metrics,
            config.pressure,
            affinity_ttl=config.store.affinity_ttl_s,
            relieve_interval_s=config.health.interval_s,
            slots=self.slots,
        )
        slots = self.slots
        self.tool_calls = (
            ToolCallPlane(
                self.pool,
                offload=self.pressure.offload_sessions,
                lossless=lambda w: slots.manages(w) or w.config.offload_url is not None,
            )
            if pressure.enabled
            else None
        )
        """Sessions away on a tool call: their KV reserved, offloaded under pressure (with
        pressure handling, as the simulator's ``sim.toolcalls``)."""
        if self.tool_calls is not None:
            self.metrics.watch_tool_calls(self.tool_calls.reading)
        self.health = HealthChecker(
            self.pool,
            config.health,
            config.outlier,
            scrape_listeners=[self.pressure.observe],
            up_listeners=[self.slots.worker_back],
        )
        self.rng = random.Random(config.seed)
        r = config.retries
        self.budget = RetryBudget(r.budget_ratio, r.budget_min, r.backoff_base_s, r.backoff_max_s)
        self.control = ControlPlane(
            config,
            self.pool,
            store=self.store,
            metrics=self.metrics,
            health=self.health,
            routing=self.routing,
        )
        gate = pressure if pressure.enabled and pressure.kv_gate else None
        self.caches = EngineCaches(config.workers)
        """KV event subscribers of the workers that publish (``kv_events:``)."""
        self.control.membership.caches = self.caches
        self.metrics.registry.register(KVEventsCollector(self.caches.counts))
        self.router = Router(
            self.pool,
            self.routing,
            self.store,
            self.metrics,
            RouteConfig(config.admission, gate, pressure.kv_gate_max_wait_s),
            affinity_ttl=config.store.affinity_ttl_s,
            rng=self.rng,
            versions=self.control.versions,
            usage_listeners=[self.pressure.record_usage, self.slots.verify],
            passive=self.health,
            outcomes=self.control.recorder,
            caches=self.caches,
            end_listeners=[self.slots.ended]
            + ([self.tool_calls.ended] if self.tool_calls is not None else []),
        )
        self.warm_ups = WarmUps(
            self.pool,
            self.routing,
            self.metrics,
            self.router.warm_up,
            timeout_s=t.total_s,
            wall=self.router.wall,
        )
        """The policy's warm-ups (``core.warmup``), cancelled at ``stop``."""
        self.draining = False
        self.peers: MetricsPeers | None = None
        """The sibling server processes whose metrics a scrape includes (``--processes``)."""
        self.proxy = Proxy(
            self.pool,
            self.router,
            self.routing,
            budget=self.budget,
            metrics=self.metrics,
            access_log=AccessLog(config.access_log, json_lines=config.json_logs),
            features=config.features_in_force(),
            max_retries=r.count,
            response_headers=config.response_headers,
            strip_client_auth=bool(config.api_keys),
            key_names=key_names(config.api_keys),
            draining=lambda: self.draining,
            rng=self.rng,
            stream_usage=config.stream_usage,
            outcomes=self.control.recorder,
            expose_worker_urls=config.expose_worker_urls,
            slots=self.slots,
            traffic=self.traffic,
            warm_ups=self.warm_ups,
            away=self.tool_calls,
            tokenizers=Tokenizers(
                config.tokenizers, {w.model: w.engine for w in config.workers if w.model}
            ),
        )
        self.reloader = Reloader(self, source)
        features = config.features_in_force()
        self.passthrough = Passthrough(self.proxy, self.pool, features, self.routing)

    @property
    def policy(self) -> Policy:
        """The routing policy in force (``routing.state.policy``)."""
        return self.routing.state.policy

    def ready(self) -> bool:
        """True when not draining and some worker can take a request."""
        if self.draining:
            return False
        now = time.monotonic()
        return any(
            w.model is not None and w.state(now, self.pool.stale_after).routable for w in self.pool
        )

    async def start(self) -> None:
        """Probe every worker once (learning models), then keep probing in the background."""
        if self.config.slots.enabled and any(w.config.engine == "llamacpp" for w in self.pool):
            await self.slots.start()  # refuses to start without a share of the slots
        await self.health.probe_all()
        for worker in self.pool:
            if worker.model is None:
                log.warning("worker %s: model unknown yet (unreachable?); will retry", worker.id)
        if not len(self.pool) and not self.config.discovery.dns:
            log.warning("no workers: add them with POST /admin/workers or configure discovery")
        config = self.config
        scope, host = config.features.session_scope, config.listen.host
        if (unchecked := unchecked_tenants(config.api_keys, scope, host)) is not None:
            log.warning("%s", unchecked)
        self.health.start()
        self.caches.start()
        self.peer_loads.start()
        await self.control.start()

    async def drain(self, grace_s: float) -> bool:
        """Refuse new requests and wait up to ``grace_s`` for in-flight ones; True if idle."""
        self.draining = True
        try:
            await asyncio.wait_for(self.proxy.idle.wait(), grace_s)
        except TimeoutError:
            log.warning("drain timeout: %d requests still in flight", self.proxy.in_flight)
            return False
        return True

    async def stop(self) -> None:
        """Stop probing and close connections and the store."""
        await self.warm_ups.close()
        await self.peer_loads.stop()
        await self.caches.close()
        await self.control.stop()
        await self.health.stop()
        if self.tool_calls is not None:
            await self.tool_calls.stop()
        await self.pressure.stop()
        await self.slots.stop()
        for worker in self.pool:
            await worker.upstream.close()
        if self._owns_store:
            with contextlib.suppress(Exception):
                await self.store.close()


GATEWAY_KEY = web.AppKey("kvgate.gateway", Gateway)


async def _models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    aliases = gateway.routing.state.aliases
    return web.json_response(models_payload(gateway.pool.models(), aliases))


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    detail: dict[str, object] = {}
    if gateway.health.model_mismatch:
        detail["model_mismatch"] = dict(gateway.health.model_mismatch)
    if gateway.ready():
        return web.json_response({"status": "ready", **detail})
    status = "draining" if gateway.draining else "no healthy worker"
    if not gateway.draining and len(gateway.pool) == 0:
        status = "no workers yet"
    return web.json_response({"status": status, **detail}, status=503)


async def _reload(request: web.Request) -> web.Response:
    """``POST /admin/reload``: re-read the config file in every server process
    (``gateway.reloads``; 409 naming what needs a restart, nothing applied)."""
    return await reload_everywhere(request.app[GATEWAY_KEY])


async def _metrics(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    # Rendering takes ~50 ms at 64 workers (prometheus_client formats ~13 µs a line);
    # in a thread the event loop keeps its turns at the GIL instead of stalling.
    body = await asyncio.get_running_loop().run_in_executor(None, gateway.metrics.render)
    if gateway.peers is not None:
        body = await gateway.peers.gather(body)  # every process's series, not just ours
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def build_app(gateway: Gateway) -> web.Application:
    """The aiohttp application serving ``gateway`` (started and stopped with the app)."""
    config = gateway.config
    stack: list[Middleware] = [
        middleware.errors,
        middleware.paths,
        middleware.header_limit(config.limits.max_header_bytes, config.limits.max_headers),
        middleware.body_limit(config.limits.max_body_bytes),
    ]
    if config.api_keys:
        stack.append(middleware.api_keys(config.client_keys))
    if config.metrics_keys:
        stack.append(middleware.api_keys(config.metrics_keys, "/metrics"))
    app = web.Application(client_max_size=config.limits.max_body_bytes, middlewares=stack)
    app[GATEWAY_KEY] = gateway
    proxy = gateway.proxy
    app.router.add_post("/v1/chat/completions", proxy.chat_completions)
    app.router.add_post("/v1/completions", proxy.completions)
    app.router.add_post("/v1/messages", proxy.messages)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    # vLLM's name for it, which clients of vLLM (guidellm) probe before a run.
    app.router.add_get("/health", _readyz)
    app.router.add_get("/metrics", _metrics)
    if config.admin.enabled:
        drain = DrainApi(gateway.pool, gateway.pressure)
        dashboard = Dashboard(gateway)
        setup_admin(
            app,
            gateway.control,
            [*drain.routes(), ("POST", "/admin/reload", _reload), *dashboard.admin_routes()],
            pages=dashboard.pages(),
        )
    app.add_routes(gateway.passthrough.routes())  # last: it ends with a /v1/ catch-all

    async def _start(app: web.Application) -> None:
        await gateway.start()

    async def _stop(app: web.Application) -> None:
        await gateway.stop()

    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    return app


def connection_limits(config: GatewayConfig) -> ConnectionLimits:
    """The per-connection deadlines and bounds of ``config`` (``limits:``)."""
    limits = config.limits
    return ConnectionLimits(
        header_timeout_s=limits.header_timeout_s,
        body_timeout_s=limits.body_timeout_s,
        max_connections_per_client=limits.max_connections_per_client,
    )


def make_runner(gateway: Gateway) -> web.AppRunner:
    """The runner serving ``gateway``'s app over guarded client connections."""
    config = gateway.config
    return GuardedAppRunner(
        build_app(gateway),
        connection_limits(config),
        # The drain already waited for in-flight work (and cut what was left): the
        # runner's own shutdown must not wait again.
        shutdown_timeout=1.0,
        **runner_options(config),
    )


def runner_options(config: GatewayConfig) -> dict[str, object]:
    """Keyword arguments for ``web.AppRunner`` serving a gateway app.

    The parser's own header limits sit well above the configured ones so that
    oversized headers reach the middleware and get a proper 431.
    """
    limit = config.limits.max_header_bytes
    return {
        "handler_cancellation": True,
        "access_log": None,
        "keepalive_timeout": config.limits.keepalive_s,
        "max_field_size": max(limit * 4, 65536),
        "max_line_size": max(limit * 4, 65536),
        "max_headers": config.limits.max_headers * 4,
    }


def data_plane_limits(config: GatewayConfig) -> DataPlaneLimits:
    """The limits and deadlines of the data plane's own server (``limits:``, ``api_keys``)."""
    limits = config.limits
    return DataPlaneLimits(
        max_header_bytes=limits.max_header_bytes,
        max_headers=limits.max_headers,
        max_line_bytes=max(limits.max_header_bytes * 4, 65536),
        max_body_bytes=limits.max_body_bytes,
        header_timeout_s=limits.header_timeout_s,
        body_timeout_s=limits.body_timeout_s,
        keepalive_s=limits.keepalive_s,
        api_keys=tuple(key.encode() for key in config.client_keys),
    )


async def listen(
    gateway: Gateway,
    runner: web.AppRunner,
    host: str,
    port: int,
    *,
    reuse_port: bool = False,
    server: str | None = None,
) -> tuple[int, DataPlane | None]:
    """Serve clients on ``host:port`` (set up ``runner`` first); the port bound, and the
    data plane's own server when it is the one listening (``listen.server``).

    With ``llhttp`` it accepts every connection and hands those whose request is not
    a generation to aiohttp's handler (``runner.server``): one port either way.
    ``OSError`` when the address cannot be bound.
    """
    config = gateway.config
    if (server or config.listen.server) == "aiohttp":
        site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None, backlog=1024)
        await site.start()
        return int(runner.addresses[-1][1]), None
    fallback = runner.server
    assert isinstance(fallback, GuardedServer), "set the runner up first"
    plane = DataPlane(gateway.proxy, data_plane_limits(config), fallback.clients, fallback)
    return await plane.start(host, port, reuse_port=reuse_port), plane
