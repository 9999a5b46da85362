"""``kvgate epp``: the gateway as an endpoint picker behind an Envoy-based gateway.

The same ``Gateway`` as ``kvgate serve`` (pool, health checks, router, store,
versions, rollouts, pressure) answers Envoy's external-processing gRPC stream
(``dataplane.extproc``) instead of moving the bytes itself. Its HTTP port stays
up for what is not on the request path: ``/metrics``, ``/readyz``, the admin API
(rollouts), the dashboard.

gRPC health checking (``grpc.health.v1``) answers for ``liveness`` (the process
serves), ``readiness`` and ``envoy.service.ext_proc.v3.ExternalProcessor`` (some
worker is routable and the picker is not draining), computed on each check.

Replicas are active-active: every replica serves picks, and with a Redis store
they share the bindings, the shared prefix state and the rollout state (one
replica at a time runs the rollout controller, under the store's lease), as
``kvgate serve`` replicas do. In-flight counts are each replica's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import (
    add_ExternalProcessorServicer_to_server,
)
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvgate.gateway.app import Gateway, make_runner
from kvgate.gateway.config import GatewayConfig
from kvgate.gateway.dataplane.extproc import ExtProc, PickerSettings
from kvgate.gateway.observe.metrics import EppMetrics
from kvgate.store.base import AffinityStore
from kvgate.waiting import wait_until

log = logging.getLogger("kvgate.gateway.epp")

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READINESS = "readiness"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _Health(health.aio.HealthServicer):  # type: ignore[misc]
    """gRPC health whose readiness is the gateway's, read at each check."""

    def __init__(self, picker: Picker) -> None:
        super().__init__()
        self.picker = picker

    async def Check(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        await self.picker.refresh_health()
        return await super().Check(request, context)


class Picker:
    """One endpoint picker: a gateway, its ext_proc gRPC server and its health service."""

    def __init__(self, config: GatewayConfig, *, store: AffinityStore | None = None) -> None:
        self.config = config
        self.gateway = Gateway(config, store=store)
        gw = self.gateway
        epp = config.epp
        self.extproc = ExtProc(
            gw.router,
            gw.pool,
            gw.proxy.relay,
            gw.health,
            PickerSettings(
                features=config.features_in_force(),
                routing=gw.routing,
                draining=lambda: gw.draining,
                response_headers=config.response_headers,
                fallbacks=epp.fallbacks,
                full_duplex_default=epp.request_body_mode == "full_duplex_streamed",
                max_body_bytes=config.limits.max_body_bytes,
                stream_usage=config.stream_usage,
                api_keys=tuple(key.encode() for key in config.client_keys),
            ),
            metrics=EppMetrics(gw.metrics.registry),
            away=gw.tool_calls,
        )
        self.health = _Health(self)
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.http_port = 0
        self._runner = make_runner(gw)

    async def refresh_health(self) -> None:
        """Set the health services from the gateway's state now."""
        ready = _SERVING if self.gateway.ready() else _NOT_SERVING
        await self.health.set(LIVENESS, _SERVING)
        await self.health.set("", _SERVING)
        await self.health.set(READINESS, ready)
        await self.health.set(EXT_PROC_SERVICE, ready)

    async def start(self, *, http: bool = True) -> int:
        """Start the gateway (probes, control plane), the HTTP port and the gRPC server;
        the gRPC port bound. ``OSError`` when an address cannot be bound."""
        await self._runner.setup()  # starts the gateway (its on_startup)
        listen = self.config.listen
        if http:
            from aiohttp import web

            site = web.TCPSite(self._runner, listen.host, listen.port)
            await site.start()
            self.http_port = int(self._runner.addresses[-1][1])
        server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", self.config.limits.max_body_bytes + 65536),
            ]
        )
        add_ExternalProcessorServicer_to_server(self.extproc, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        host = self.config.epp.host or listen.host
        shown = f"[{host}]" if ":" in host else host
        self.port = server.add_insecure_port(f"{shown}:{self.config.epp.port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {shown}:{self.config.epp.port}")
        await server.start()
        self.server = server
        await self.refresh_health()
        return self.port

    async def drain(self, grace_s: float) -> bool:
        """Refuse new picks (readiness off, immediate 503s) and wait for open streams."""
        self.gateway.draining = True
        await self.refresh_health()
        with contextlib.suppress(TimeoutError):
            # Streams end in Envoy's time (its responses), not on a signal of ours: polled.
            await wait_until(lambda: not self.extproc.streams, grace_s, 0.05, "streams ended")
        return not self.extproc.streams

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop the gRPC server, then the gateway."""
        if self.server is not None:
            await self.server.stop(grace_s)
            self.server = None
        await self._runner.cleanup()


async def serve_picker(config: GatewayConfig, stop: asyncio.Event | None = None) -> bool:
    """Serve picks until SIGTERM/SIGINT (or ``stop``), then drain; True when drained."""
    import signal

    picker = Picker(config)
    stopping = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stopping.set)
    drained = False
    try:
        port = await picker.start()
        log.info(
            "kvgate endpoint picker: ext_proc on port %d, HTTP on %d (policy %s, %d workers)",
            port,
            picker.http_port,
            config.policy.name,
            len(config.workers),
        )
        await stopping.wait()
        drained = await picker.drain(config.drain_timeout_s)
    finally:
        await picker.stop()
    return drained


def run(config: GatewayConfig) -> int:
    """``kvgate epp``: serve in this process; the exit status."""
    from kvgate.gateway.observe.logs import configure_logging
    from kvgate.gateway.server import log_level

    configure_logging(config.json_logs, log_level(config))
    try:
        drained = asyncio.run(serve_picker(config))
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        return 2
    return 0 if drained else 3
