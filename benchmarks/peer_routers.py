"""The routers kvgate is measured against, installed and started the same way each time.

The Rust routers come from PyPI into throwaway virtualenvs under
``~/.cache/kvgate-peers/<name>`` (created on first use, reused after); HAProxy is
Debian's package (``apt-get install haproxy``) and serves as the floor: a proxy
with no routing logic. Every router here is a command line plus the processes
whose CPU time counts as the router's (the whole process tree).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PEERS_HOME = Path.home() / ".cache" / "kvgate-peers"

PEER_PACKAGES = {
    "sglang-router": "sglang-router==0.3.2",
    "vllm-router": "vllm-router==0.1.17",
}
"""The PyPI release of each peer router measured (the versions of issue 17's table)."""


def peer_binary(name: str, *, install: bool = True) -> Path | None:
    """The peer's executable, installed into its own virtualenv when missing (or None)."""
    venv = PEERS_HOME / name
    binary = venv / "bin" / name
    if binary.exists():
        return binary
    if not install:
        return None
    PEERS_HOME.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", PEER_PACKAGES[name]], check=True
    )
    return binary if binary.exists() else None


def haproxy_config(port: int, workers: list[tuple[str, int]]) -> str:
    """A round-robin HTTP proxy on ``port``: one thread, keep-alive both ways."""
    servers = "\n".join(f"    server w{i} {h}:{p}" for i, (h, p) in enumerate(workers))
    return f"""global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
    http-reuse always
frontend kvgate_bench
    bind 127.0.0.1:{port}
    default_backend workers
backend workers
    balance roundrobin
{servers}
"""


@dataclass(frozen=True)
class RouterSpec:
    """How to start one router in front of the workers."""

    name: str
    command: Callable[[int, list[str], Path], list[str]]
    """(port, worker URLs, scratch folder) -> argv."""
    ready_path: str = "/health"


def kvgate_spec(kvgate: str, policy: str, processes: int, store: str | None) -> RouterSpec:
    """``kvgate serve`` with ``processes`` server processes (``store`` when several)."""

    def command(port: int, urls: list[str], _scratch: Path) -> list[str]:
        argv = [kvgate, "serve", "--port", str(port), "--policy", policy]
        argv += ["--processes", str(processes)]
        if store is not None:
            argv += ["--store", store]
        for url in urls:
            argv += ["--worker", url]
        return argv

    name = "kvgate" if processes == 1 else f"kvgate x{processes}"
    return RouterSpec(name, command, "/readyz")


def rust_spec(name: str, binary: Path, policy: str, free_port: Callable[[], int]) -> RouterSpec:
    """sglang-router or vllm-router (the same command line: vllm-router forked the other)."""

    def command(port: int, urls: list[str], _scratch: Path) -> list[str]:
        return [
            str(binary),
            *(["launch"] if name == "sglang-router" else []),
            "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *urls,
            "--policy", policy,
            "--log-level", "error" if name == "vllm-router" else "warn",
            "--prometheus-port", str(free_port()),
            "--max-concurrent-requests", "100000",
        ]  # fmt: skip

    return RouterSpec(name, command, "/health")


def haproxy_spec() -> RouterSpec | None:
    """HAProxy from Debian's package, or None when it is not installed."""
    binary = shutil.which("haproxy")
    if binary is None:
        return None

    def command(port: int, urls: list[str], scratch: Path) -> list[str]:
        workers = []
        for url in urls:
            host, _, p = url.removeprefix("http://").partition(":")
            workers.append((host, int(p)))
        path = scratch / "haproxy.cfg"
        path.write_text(haproxy_config(port, workers))
        return [binary, "-f", str(path), "-db"]

    return RouterSpec("haproxy", command, "/health")
