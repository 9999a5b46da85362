"""Running the gateway: one process on uvloop, or several sharing the port.

SIGTERM (or SIGINT) drains: readiness turns false, new requests get 503,
in-flight requests and streams finish up to ``drain_timeout_s``, then the
process exits. With ``listen.processes > 1`` the parent starts that many server
processes bound with ``SO_REUSEPORT`` (the kernel spreads connections), each
with its own state; they share affinities only through a Redis store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import signal
from collections.abc import Callable

from aiohttp import web

from kvgate.gateway.app import Gateway, build_app, runner_options
from kvgate.gateway.config import ConfigError, GatewayConfig
from kvgate.gateway.logs import configure_logging

log = logging.getLogger("kvgate.gateway.server")


async def serve(
    config: GatewayConfig,
    *,
    reuse_port: bool = False,
    on_listening: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set), then drain and return."""
    gateway = Gateway(config)
    runner = web.AppRunner(build_app(gateway), **runner_options(config))  # type: ignore[arg-type]
    await runner.setup()
    stopping = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stopping.set)
    try:
        site = web.TCPSite(
            runner,
            config.listen.host,
            config.listen.port,
            reuse_port=reuse_port or None,
            backlog=1024,
        )
        await site.start()
        port = int(runner.addresses[0][1])
        log.info(
            "kvgate gateway listening on http://%s:%d (policy %s, %d workers)",
            config.listen.host,
            port,
            config.policy.name,
            len(config.workers),
        )
        if on_listening is not None:
            on_listening(port)
        await stopping.wait()
        log.info("draining: new requests refused, waiting up to %.0fs", config.drain_timeout_s)
        await gateway.drain(config.drain_timeout_s)
    finally:
        await runner.cleanup()
    log.info("stopped")


def _run_one(config: GatewayConfig, reuse_port: bool) -> None:
    configure_logging(config.json_logs)
    try:
        import uvloop

        uvloop.run(serve(config, reuse_port=reuse_port))
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(config, reuse_port=reuse_port))


def run(config: GatewayConfig) -> int:
    """Serve ``config`` in this process, or in ``listen.processes`` children; exit status."""
    processes = config.listen.processes
    if processes == 1:
        _run_one(config, reuse_port=False)
        return 0
    if config.listen.port == 0:
        raise ConfigError("listen.port: several processes need a fixed port, not 0")
    configure_logging(config.json_logs)
    ctx = multiprocessing.get_context("spawn")
    children = [
        ctx.Process(target=_run_one, args=(config, True), name=f"kvgate-serve-{i}")
        for i in range(processes)
    ]
    for child in children:
        child.start()

    def forward(signum: int, _frame: object) -> None:
        # Each child drains on SIGTERM on its own; the parent only passes it on.
        for child in children:
            if child.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    child.terminate()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for child in children:
        child.join()
    return max((abs(child.exitcode or 0) for child in children), default=0)
