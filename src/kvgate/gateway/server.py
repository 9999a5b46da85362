"""Running the gateway: one process on uvloop, or several sharing the port.

SIGTERM (or SIGINT) drains: readiness turns false, new requests get 503,
in-flight requests and streams finish up to ``drain_timeout_s``, then the
process exits: 0 when everything finished, ``DRAIN_CUT_SHORT`` when the deadline
cut requests off (their connections are closed at the deadline, not later).
SIGHUP never kills: it re-reads the config file (``control.reload``), and a
refused reload is one log line; the gateway serves on. A port already in use is
one line and exit status 2.

With several processes (``GatewayConfig.server_processes``: one per core with a
Redis store by default) the parent starts that many server processes bound with
``SO_REUSEPORT`` (the kernel spreads connections); they agree on placement
through the shared store, and the configuration refuses several processes on
the memory store. A metrics scrape that lands on any of them answers for all
(``observe.federation``).

The parent supervises: it waits until every server process listens (or has
failed) before it passes SIGTERM/SIGINT on, so a stop that arrives during
start-up still drains every process; it reports a process that dies while the
others serve, and exits 0 only when every process drained cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from aiohttp import web

from kvgate.gateway.app import Gateway, listen, make_runner
from kvgate.gateway.config import ConfigError, ConfigSource, GatewayConfig
from kvgate.gateway.dataplane.errors import GatewayError
from kvgate.gateway.dataplane.listener import DataPlane
from kvgate.gateway.observe.federation import MetricsPeers
from kvgate.gateway.observe.logs import configure_logging
from kvgate.gateway.reloads import sibling_handler

log = logging.getLogger("kvgate.gateway.server")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that make a gateway drain and exit."""

HANGUP = signal.SIGHUP
"""Re-read the config file (``control.reload``); never a reason to die."""

_BLOCKED = (*STOP_SIGNALS, HANGUP)
"""Held pending in a server process until its own handlers are in place."""

STARTUP_TIMEOUT_S = 60.0
"""A server process not listening this long after it was started is killed."""

DRAIN_CUT_SHORT = 3
"""Exit status of a server process whose drain deadline cut in-flight requests off."""

_T = TypeVar("_T")


class ListenError(ConfigError):
    """The gateway cannot listen where it was told to (port in use, address not here)."""


async def _reload(gateway: Gateway) -> None:
    """SIGHUP: re-read the config file; a refusal is logged, the gateway serves on."""
    log.info("SIGHUP: reloading the configuration")
    try:
        await gateway.reloader.reload_source()
    except GatewayError as exc:
        log.error("SIGHUP: %s", exc)


async def serve(
    config: GatewayConfig,
    *,
    source: ConfigSource | None = None,
    reuse_port: bool = False,
    on_listening: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
    peers: MetricsPeers | None = None,
) -> bool:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set), then drain and return.

    True when every in-flight request finished within ``drain_timeout_s``; at
    the deadline what is left is cut off (connections closed) and False is
    returned at once. ``ListenError`` when the address cannot be bound.
    """
    gateway = Gateway(config, source=source)
    gateway.peers = peers
    runner = make_runner(gateway)
    await runner.setup()
    stopping = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stopping.set)
    reloads: set[asyncio.Task[None]] = set()

    def on_hup() -> None:
        task = loop.create_task(_reload(gateway), name="kvgate-reload")
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(HANGUP, on_hup)
    drained = False
    plane: DataPlane | None = None
    try:
        try:
            port, plane = await listen(
                gateway, runner, config.listen.host, config.listen.port, reuse_port=reuse_port
            )
        except OSError as exc:
            where = f"{config.listen.host}:{config.listen.port}"
            raise ListenError(f"cannot listen on {where}: {exc.strerror or exc}") from None
        if peers is not None:

            async def own_metrics(request: web.Request) -> web.Response:
                return web.Response(body=gateway.metrics.render())

            await peers.start(own_metrics, sibling_handler(gateway))
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
        drained = await gateway.drain(config.drain_timeout_s)
        if not drained:
            _cut_connections(runner)
            if plane is not None:
                plane.cut()
    finally:
        if peers is not None:
            await peers.stop()
        if plane is not None:
            await plane.stop()
        await runner.cleanup()
    log.info("stopped" if drained else "stopped at the drain deadline, requests cut short")
    return drained


def _cut_connections(runner: web.BaseRunner) -> None:
    """Close every client connection now: the drain deadline has passed.

    Their handlers are cancelled (``handler_cancellation``), which drops their
    upstream requests, so the workers stop generating for them too.
    """
    server = runner.server
    if server is None:
        return
    connections = server.connections
    log.warning("drain deadline: closing %d client connections", len(connections))
    for connection in connections:
        connection.force_close()


def log_level(config: GatewayConfig) -> int:
    """The ``logging`` level ``log_level`` names."""
    return int(getattr(logging, config.log_level.upper()))


def _run_loop(main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` on uvloop (asyncio's own loop where uvloop is missing)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main)
    result: _T = uvloop.run(main)
    return result


def _run_one(config: GatewayConfig, source: ConfigSource | None) -> int:
    configure_logging(config.json_logs, log_level(config))
    return 0 if _run_loop(serve(config, source=source)) else DRAIN_CUT_SHORT


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel send SIGTERM (a drain) to this process when the parent dies."""
    if sys.platform != "linux":  # pragma: no cover - PR_SET_PDEATHSIG is Linux-only
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def _run_child(
    config: GatewayConfig,
    ready: Connection,
    parent_pid: int,
    index: int,
    peers_dir: str,
    *,
    source: ConfigSource | None,
) -> None:
    """One of several server processes: report the port on ``ready`` once listening.

    The stop signals arrive blocked (the parent blocked them around the spawn and
    the mask survives exec): one sent during start-up stays pending until the
    loop's handlers are installed, then drains as usual instead of killing.
    """
    _die_with_parent(parent_pid)
    configure_logging(config.json_logs, log_level(config))

    def listening(port: int) -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
        with contextlib.suppress(OSError):
            ready.send(port)
        ready.close()

    try:
        peers = MetricsPeers(peers_dir, index, config.server_processes())
        drained = _run_loop(
            serve(config, source=source, reuse_port=True, on_listening=listening, peers=peers)
        )
    except ListenError as exc:
        log.error("%s", exc)
        sys.exit(2)
    sys.exit(0 if drained else DRAIN_CUT_SHORT)


@dataclass(slots=True)
class _Child:
    """One supervised server process and what the parent knows of it."""

    index: int
    process: BaseProcess
    ready: Connection | None
    """The parent's end of the "listening" pipe, until the child reported or died."""
    listening: bool = False
    exited: bool = False

    @property
    def starting(self) -> bool:
        """Neither listening nor dead yet."""
        return not self.listening and not self.exited


class _Supervisor:
    """Starts the server processes, forwards stop signals, reports deaths, sums up."""

    def __init__(self, config: GatewayConfig, source: ConfigSource | None = None) -> None:
        self.config = config
        self.source = source
        self.children: list[_Child] = []
        self.received: list[int] = []
        self.forwarded = 0
        self.hangups = 0
        self.hangups_forwarded = 0
        self.peers_dir = tempfile.mkdtemp(prefix="kvgate-metrics-")
        """Where each server process serves its own metrics page to its siblings."""
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)

    def run(self) -> int:
        """Serve until every child has exited; the exit status (0: all drained)."""
        previous = {signum: signal.signal(signum, self._on_signal) for signum in _BLOCKED}
        old_wakeup = signal.set_wakeup_fd(self._wake_w)
        try:
            self._start()
            return self._supervise()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            os.close(self._wake_r)
            os.close(self._wake_w)
            shutil.rmtree(self.peers_dir, ignore_errors=True)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == HANGUP:
            self.hangups += 1  # passed on to every server process, which reloads or logs
        else:
            self.received.append(signum)

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
        try:
            for index in range(self.config.server_processes()):
                reader, writer = ctx.Pipe(duplex=False)
                process = ctx.Process(
                    target=_run_child,
                    args=(self.config, writer, os.getpid(), index, self.peers_dir),
                    kwargs={"source": self.source},
                    name=f"kvgate-serve-{index}",
                )
                try:
                    process.start()
                except BaseException:
                    for child in self.children:
                        child.process.kill()
                        child.process.join()
                    raise
                writer.close()
                self.children.append(_Child(index, process, reader))
        finally:
            # Signals that came meanwhile are delivered now, to _on_signal.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)

    def _supervise(self) -> int:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not all(child.exited for child in self.children):
            waitables: list[Any] = [self._wake_r]
            for child in self.children:
                if child.ready is not None:
                    waitables.append(child.ready)
                if not child.exited:
                    waitables.append(child.process.sentinel)
            starting = any(child.starting for child in self.children)
            timeout = max(0.0, deadline - time.monotonic()) if starting else None
            wait(waitables, timeout)
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_r, 512):
                    pass
            self._check_children()
            if starting and time.monotonic() >= deadline:
                self._kill_laggards()
            if not any(child.starting for child in self.children):
                self._forward()
        return self._status()

    def _check_children(self) -> None:
        alive = sum(not child.exited for child in self.children)
        for child in self.children:
            if child.ready is not None and child.ready.poll():
                with contextlib.suppress(EOFError, OSError):
                    port = child.ready.recv()
                    child.listening = True
                    log.info("gateway process %d (pid %s) listening on port %s",
                             child.index, child.process.pid, port)  # fmt: skip
                child.ready.close()
                child.ready = None
            if not child.exited and not child.process.is_alive():
                child.process.join()
                child.exited = True
                alive -= 1
                self._report_exit(child, alive)

    def _report_exit(self, child: _Child, alive: int) -> None:
        code = child.process.exitcode
        total = len(self.children)
        if self.received and code == 0:
            log.info("gateway process %d drained and exited", child.index)
        elif self.received and code == DRAIN_CUT_SHORT:
            log.warning("gateway process %d exited with requests still in flight", child.index)
        elif not child.listening:
            log.error("gateway process %d failed to start (exit status %s); %d of %d serving",
                      child.index, code, alive, total)  # fmt: skip
        else:
            log.error("gateway process %d died unexpectedly (exit status %s); %d of %d serving",
                      child.index, code, alive, total)  # fmt: skip
        if alive == 0 and not self.received:
            log.error("every gateway process has exited")

    def _kill_laggards(self) -> None:
        for child in self.children:
            if child.starting and child.process.is_alive():
                log.error("gateway process %d not listening after %.0fs: killing it",
                          child.index, STARTUP_TIMEOUT_S)  # fmt: skip
                child.process.kill()

    def _forward(self) -> None:
        # Each child drains on its own; the parent passes every stop signal on once.
        for signum in self.received[self.forwarded :]:
            for child in self.children:
                if not child.exited and child.process.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.process.pid, signum)
        self.forwarded = len(self.received)
        if self.hangups > self.hangups_forwarded:
            log.info("SIGHUP: passed on to the gateway processes")
            for child in self.children:
                if not child.exited and child.process.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.process.pid, HANGUP)
            self.hangups_forwarded = self.hangups

    def _status(self) -> int:
        codes = [child.process.exitcode for child in self.children]
        if all(code == 0 for code in codes):
            return 0
        log.error("gateway processes exited with statuses %s", codes)
        return 1


def run(config: GatewayConfig, source: ConfigSource | None = None) -> int:
    """Serve ``config`` in this process, or in ``server_processes()`` children; exit status.

    ``source`` is where ``config`` came from: SIGHUP reads it again (``control.reload``).
    """
    if config.server_processes() == 1:
        if config.listen.processes is None and config.store.url == "memory":
            configure_logging(config.json_logs, log_level(config))
            log.info("one server process: the memory store is not shared between processes "
                     "(a Redis store runs one per core)")  # fmt: skip
        return _run_one(config, source)
    if config.listen.port == 0:
        raise ConfigError("listen.port: several processes need a fixed port, not 0")
    configure_logging(config.json_logs, log_level(config))
    return _Supervisor(config, source).run()
