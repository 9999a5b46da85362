"""Running a worker: in-process for tests (``running_worker``) and as a server (CLI)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web

from kvgate.engine import Engine
from kvgate.workersim.app import KV_PUBLISHER_KEY, create_app
from kvgate.workersim.options import WorkerOptions
from kvgate.workersim.worker import WORKER_KEY, Worker

if TYPE_CHECKING:
    from kvgate.kvevents.publisher import KVEventPublisher

logger = logging.getLogger(__name__)


class WorkerHandle:
    """A running in-process worker: where it listens, its engine, and how to end it."""

    def __init__(self, runner: web.AppRunner, options: WorkerOptions) -> None:
        self._runner = runner
        self.options = options
        self.worker: Worker = runner.app[WORKER_KEY]
        self._stopped = False

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:8001`` (append ``/v1`` for a client)."""
        return f"http://{self.options.host}:{self.options.port}"

    @property
    def engine(self) -> Engine:
        """The engine the worker drives (tests may read its stats)."""
        return self.worker.engine

    @property
    def kv_publisher(self) -> KVEventPublisher | None:
        """The KV event publisher, when the worker publishes (``--kv-events-port``)."""
        return self._runner.app.get(KV_PUBLISHER_KEY)

    @property
    def stopped(self) -> bool:
        """True once ``stop`` or ``kill`` ran."""
        return self._stopped

    async def stop(self) -> None:
        """Stop gracefully: stop listening, let in-flight answers finish briefly, stop."""
        if self._stopped:
            return
        self._stopped = True
        await self._runner.cleanup()

    async def kill(self) -> None:
        """Die abruptly: close the listener and reset every open connection at once.

        Clients see connection resets mid-answer, as when a worker process crashes.
        """
        if self._stopped:
            return
        self._stopped = True
        for site in list(self._runner.sites):
            await site.stop()
        server = self._runner.server
        if server is not None:
            for connection in server.connections:
                if connection.transport is not None:
                    connection.transport.abort()
        await self.worker.driver.stop()
        await self._runner.cleanup()


async def start_worker(options: WorkerOptions, shutdown_timeout: float = 1.0) -> WorkerHandle:
    """Start a worker on the running loop; ``port=0`` picks a free port."""
    runner = web.AppRunner(
        create_app(options),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, options.host, options.port, reuse_address=True)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    port = int(runner.addresses[0][1])
    return WorkerHandle(runner, options.model_copy(update={"port": port}))


@contextlib.asynccontextmanager
async def running_worker(
    options: WorkerOptions | None = None, shutdown_timeout: float = 1.0
) -> AsyncIterator[WorkerHandle]:
    """A worker running in this process for the block's duration.

    >>> async with running_worker(WorkerOptions(port=0, profile="fast")) as worker:
    ...     client = AsyncOpenAI(base_url=worker.url + "/v1", api_key="x")
    """
    handle = await start_worker(options or WorkerOptions(port=0), shutdown_timeout)
    try:
        yield handle
    finally:
        await handle.stop()


async def serve(options: WorkerOptions) -> None:
    """Serve until SIGINT or SIGTERM (the ``kvgate worker-sim`` command)."""
    handle = await start_worker(options, shutdown_timeout=5.0)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, done.set)
    logger.info(
        "worker-sim %s (%s) serving model %r on %s",
        options.version,
        options.profile,
        options.model,
        handle.url,
    )
    print(f"kvgate worker-sim listening on {handle.url}", flush=True)
    try:
        await done.wait()
    finally:
        await handle.stop()
