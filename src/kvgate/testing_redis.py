"""A throwaway ``redis-server`` for tests and benchmarks.

Runs on a free port with persistence off, in a temporary directory, and can be
stopped and started again on the same port (to test a store riding out an outage).
Never touches the system Redis on 6379.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from types import TracebackType

from kvgate.testing import free_port, wait_until_sync

DEFAULT_BINARY = "/usr/bin/redis-server"


def find_redis_server() -> str | None:
    """The path of a ``redis-server`` binary, or ``None`` if there is none."""
    if os.access(DEFAULT_BINARY, os.X_OK):
        return DEFAULT_BINARY
    return shutil.which("redis-server")


def _answers_ping(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process on ``127.0.0.1:port``; a sync context manager.

    ``start()`` returns once the server answers PING; ``stop()`` terminates it and
    waits. Both may be called repeatedly; the port stays the same.
    """

    def __init__(
        self,
        port: int | None = None,
        binary: str | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 10.0,
    ) -> None:
        found = binary or find_redis_server()
        if found is None:
            raise FileNotFoundError("redis-server not found")
        self.binary = found
        self.host = host
        self.port = port or free_port(host)
        self.startup_timeout = startup_timeout
        self._dir = tempfile.TemporaryDirectory(prefix="kvgate-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://host:port/0`` for this server."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (benchmarks count its CPU as the store's)."""
        return self._process.pid if self.running and self._process is not None else None

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> RedisServer:
        """Start the server (no-op if running) and wait until it answers."""
        if self.running:
            return self
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir.name,
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        process = self._process

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {process.returncode}")
            return _answers_ping(self.host, self.port)

        wait_until_sync(ready, timeout=self.startup_timeout, message="redis-server to answer")
        return self

    def stop(self) -> None:
        """Terminate the server (no-op if stopped) and wait for it to exit."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
