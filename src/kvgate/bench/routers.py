"""The routers the peers benchmark and the live judge put in front of a fleet, and how to get each.

kvgate itself (``default``, and ``round_robin`` for reference) runs from this
checkout. The peers are installed from PyPI into throwaway virtualenvs under
``~/.cache/kvgate-peers/<name>`` (``KVGATE_PEERS_CACHE`` moves it), kept between
runs so a second run installs nothing: sglang-router 0.3.2 and its successor the
Shepherd Model Gateway (``smg``), both ``--policy cache_aware``, and vllm-router
(``--policy cache_aware``, its default). HAProxy from Debian's packages is the
stateless round-robin baseline (installed with apt-get when missing and root).

Each router's command line was taken from its own ``--help`` after install. Every
router gets a free port of its own for its metrics endpoint, so two runs on one
machine never collide on a default port.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from kvgate.core.policies import default_registry, with_time_scale

KVGATE = str(Path(sys.executable).parent / "kvgate")
"""The ``kvgate`` command of the interpreter running the benchmark (this checkout)."""

MODEL = "demo"
"""The model the emulated workers serve; every request names it explicitly."""


def peers_cache() -> Path:
    """Where the peers' virtualenvs live (kept between runs)."""
    return Path(os.environ.get("KVGATE_PEERS_CACHE", "~/.cache/kvgate-peers")).expanduser()


@dataclass(frozen=True)
class Launch:
    """What a router needs to start: its workers, its ports and a folder for its files."""

    workers: Sequence[str]
    port: int
    metrics_port: int
    workdir: Path
    seed: int = 0
    venv: Path | None = None
    time_scale: float = 1.0
    """The workers' model seconds per real second (kvgate's default takes model-time rates)."""
    offload_tier: bool = False
    """The workers keep KV they are asked to offload (a CPU tier): kvgate is told so."""


@dataclass(frozen=True)
class Router:
    """One router of the benchmark: how it is installed and how it is started."""

    name: str
    description: str
    argv: Callable[[Launch], list[str]]
    package: str | None = None
    """PyPI requirement installed into the router's own virtualenv (None: nothing)."""
    distribution: str | None = None
    """The installed distribution's name, to check what a cached virtualenv holds."""
    debian: str | None = None
    """A Debian package providing the router's command (installed when missing)."""


def _kvgate(policy: str, **options: object) -> Callable[[Launch], list[str]]:
    """kvgate serving ``policy`` with ``options`` (on top of the fleet's time scale)."""

    def argv(launch: Launch) -> list[str]:
        config = {
            "listen": {"host": "127.0.0.1", "port": launch.port},
            "workers": [
                {"url": url, "model": MODEL}
                | ({"offload_url": url + "/kv/offload"} if launch.offload_tier else {})
                for url in launch.workers
            ],
            "policy": {
                "name": policy,
                "options": with_time_scale(default_registry(), policy, options, launch.time_scale),
            },
            "health": {"interval_s": 0.2, "timeout_s": 1.0},
            "seed": launch.seed,
        }
        suffix = "".join(f"-{key}={value}" for key, value in options.items())
        path = launch.workdir / f"kvgate-{policy}{suffix}.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return [KVGATE, "serve", "--config", str(path)]

    return argv


def kvgate_router(policy: str, **options: object) -> Router:
    """kvgate serving any registered ``policy`` (with ``options``), started as the others."""
    return Router(f"kvgate-{policy}", f"kvgate, policy {policy}", _kvgate(policy, **options))


def _venv_bin(launch: Launch, command: str) -> str:
    if launch.venv is None:
        raise RuntimeError("this router runs from its own virtualenv, which was not prepared")
    return str(launch.venv / "bin" / command)


def _cache_aware(launch: Launch, log_level: str) -> list[str]:
    """The options the Rust routers (sglang-router, smg, vllm-router) share: the fleet,
    ``cache_aware``, their Prometheus port, a quick startup check."""
    return [
        "--host", "127.0.0.1", "--port", str(launch.port),
        "--worker-urls", *launch.workers,
        "--policy", "cache_aware",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(launch.metrics_port),
        "--worker-startup-check-interval", "1",
        "--log-level", log_level,
    ]  # fmt: skip


def _sglang_router(launch: Launch) -> list[str]:
    python = _venv_bin(launch, "python")
    return [python, "-m", "sglang_router.launch_router", *_cache_aware(launch, "warn")]


def _smg(launch: Launch) -> list[str]:
    return [_venv_bin(launch, "smg"), "launch", *_cache_aware(launch, "warn")]


def _vllm_router(launch: Launch) -> list[str]:
    return [_venv_bin(launch, "vllm-router"), *_cache_aware(launch, "warning")]


def haproxy_config(port: int, workers: Sequence[str]) -> str:
    """An HAProxy config: HTTP mode, round robin over ``workers``, long stream timeouts."""
    servers = "\n".join(
        f"    server w{i} {url.removeprefix('http://').rstrip('/')}"
        for i, url in enumerate(workers)
    )
    return (
        "global\n    maxconn 4096\n\n"
        "defaults\n    mode http\n    option http-keep-alive\n"
        "    timeout connect 5s\n    timeout client 900s\n    timeout server 900s\n\n"
        f"frontend peers\n    bind 127.0.0.1:{port}\n    default_backend workers\n\n"
        f"backend workers\n    balance roundrobin\n{servers}\n"
    )


def _haproxy(launch: Launch) -> list[str]:
    path = launch.workdir / "haproxy.cfg"
    path.write_text(haproxy_config(launch.port, launch.workers), encoding="utf-8")
    command = shutil.which("haproxy") or "/usr/sbin/haproxy"
    return [command, "-db", "-f", str(path)]  # -db: stay in the foreground


ROUTERS: dict[str, Router] = {
    router.name: router
    for router in (
        Router("kvgate-default", "kvgate, policy default", _kvgate("default")),
        Router(
            "kvgate-nowarm",
            "kvgate, policy default without warm-ups (warm_min_blocks 0)",
            _kvgate("default", warm_min_blocks=0),
        ),
        Router("kvgate-round_robin", "kvgate, policy round_robin", _kvgate("round_robin")),
        Router(
            "sglang-router",
            "sglang-router 0.3.2, cache_aware",
            _sglang_router,
            package="sglang-router==0.3.2",
            distribution="sglang-router",
        ),
        Router(
            "smg",
            "Shepherd Model Gateway (smg launch), cache_aware",
            _smg,
            package="smg",
            distribution="smg",
        ),
        Router(
            "vllm-router",
            "vllm-router, cache_aware",
            _vllm_router,
            package="vllm-router",
            distribution="vllm-router",
        ),
        Router("haproxy", "HAProxy (Debian), roundrobin", _haproxy, debian="haproxy"),
    )
}
"""Every router the benchmark knows, in table order."""


def _installed_version(python: Path, distribution: str) -> str | None:
    probe = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def _wanted(package: str, version: str) -> bool:
    """Whether an installed ``version`` satisfies ``package`` (only ``==`` pins are checked)."""
    _, sep, pinned = package.partition("==")
    return not sep or pinned.strip() == version


def prepare(router: Router, log: Callable[[str], None] = print) -> Path | None:
    """Install what ``router`` needs (once); its virtualenv, if it has one.

    Raises ``RuntimeError`` with the installer's own error when that fails.
    """
    if router.debian is not None:
        _ensure_debian(router.debian, log)
    if router.package is None or router.distribution is None:
        return None
    venv = peers_cache() / router.name
    python = venv / "bin" / "python"
    if python.exists():
        version = _installed_version(python, router.distribution)
        if version is not None and _wanted(router.package, version):
            return venv
    log(f"installing {router.package} into {venv}")
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         router.package],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise RuntimeError(f"{' '.join(step[:4])} failed: " + " | ".join(tail))
    return venv


def _ensure_debian(package: str, log: Callable[[str], None]) -> None:
    if shutil.which(package) or Path(f"/usr/sbin/{package}").exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"{package} is not installed (apt-get install -y {package} as root)")
    log(f"installing {package} with apt-get")
    for step in (["apt-get", "install", "-y", package], ["apt-get", "update"]):
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode == 0 and step[1] == "install":
            return
    done = subprocess.run(
        ["apt-get", "install", "-y", package], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"apt-get install -y {package} failed: {done.stderr.strip()[-300:]}")
