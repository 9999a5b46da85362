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
        extra_args: tuple[str, ...] = (),
    ) -> None:
        found = binary or find_redis_server()
        if found is None:
            raise FileNotFoundError("redis-server not found")
        self.binary = found
        self.host = host
        self.port = port or free_port(host)
        self.startup_timeout = startup_timeout
        self.extra_args = extra_args
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
            *self.extra_args,
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


class RedisClusterServers:
    """A real Redis Cluster on loopback: ``masters`` masters, each with ``replicas``.

    Started with ``redis-server --cluster-enabled yes`` per node and joined by
    ``redis-cli --cluster create``; ``start()`` returns once every node reports
    ``cluster_state:ok``. ``cluster-node-timeout`` is short so a failover takes
    about a second or two.
    """

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        self.masters = masters
        self.replicas = replicas
        self.nodes: list[RedisServer] = []
        for _ in range(masters * (1 + replicas)):
            args = (
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms),
                "--cluster-port", str(free_port("127.0.0.1")),
                "--cluster-replica-validity-factor", "0",
            )  # fmt: skip
            self.nodes.append(RedisServer(extra_args=args))

    @property
    def url(self) -> str:
        """``redis+cluster://host:port,...`` naming every node as a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> RedisClusterServers:
        """Start every node, create the cluster, wait until it is ``ok`` everywhere."""
        for node in self.nodes:
            node.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise FileNotFoundError("redis-cli not found")
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(self.replicas),
             "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        wait_until_sync(self.healthy, timeout=30, interval=0.1, message="cluster_state:ok")
        return self

    def info(self, node: RedisServer, *command: str) -> str:
        """One ``redis-cli`` command's output against ``node``."""
        cli = shutil.which("redis-cli") or "redis-cli"
        out = subprocess.run(
            [cli, "-p", str(node.port), *command],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout

    def healthy(self) -> bool:
        """True when every running node says ``cluster_state:ok``."""
        return all(
            "cluster_state:ok" in self.info(node, "cluster", "info")
            for node in self.nodes
            if node.running
        )

    def master_of(self, key: str) -> RedisServer:
        """The running node that is master for ``key``'s slot now."""
        for node in self.nodes:
            if not node.running:
                continue
            role = self.info(node, "role").split()
            slot = self.info(node, "cluster", "keyslot", key).strip()
            if role and role[0] == "master" and self._serves(node, int(slot)):
                return node
        raise LookupError(f"no master serves {key!r}")

    def _serves(self, node: RedisServer, slot: int) -> bool:
        for line in self.info(node, "cluster", "nodes").splitlines():
            fields = line.split()
            if "myself" not in fields[2]:
                continue
            for part in fields[8:]:
                low, _, high = part.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return True
        return False

    def close(self) -> None:
        """Stop every node and remove their directories."""
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisClusterServers:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
