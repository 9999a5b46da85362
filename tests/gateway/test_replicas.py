"""Gateway replicas: separate processes sharing Redis place sessions identically, and
``kvgate serve --processes N`` supervises its server processes (drain, exit status)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from kvgate.testing import free_port, wait_until
from kvgate.testing_redis import RedisServer, find_redis_server
from kvgate.workersim import WorkerOptions, running_worker
from kvgate.workersim.runner import WorkerHandle

KVGATE = str(Path(sys.executable).parent / "kvgate")
START_TIMEOUT_S = 30.0
"""Generous: a gateway process imports for a few seconds on a busy two-core machine."""


@dataclass
class GatewayProcess:
    """A ``kvgate serve`` subprocess and the log lines it wrote to stderr so far."""

    proc: asyncio.subprocess.Process
    url: str
    lines: list[str] = field(default_factory=list)

    def logged(self, text: str) -> int:
        """How many log lines contain ``text``."""
        return sum(text in line for line in self.lines)

    def server_children(self) -> list[int]:
        """Pids of the server processes (not multiprocessing's resource tracker)."""
        pid = self.proc.pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return []
        found = []
        for child in children:
            with contextlib.suppress(OSError):
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
        return found


def _exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _config(tmp_path: Path, name: str, workers: Sequence[WorkerHandle], **extra: Any) -> Path:
    data: dict[str, Any] = {
        "workers": [{"url": w.url} for w in workers],
        "expose_worker_urls": True,  # answers are attributed to worker URLs
        "health": {"interval_s": 0.1, "timeout_s": 1.0},
        "drain_timeout_s": 10.0,
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@contextlib.asynccontextmanager
async def gateway_process(config: Path, port: int) -> AsyncIterator[GatewayProcess]:
    """``kvgate serve --config config --port port`` for the block; killed if still running."""
    proc = await asyncio.create_subprocess_exec(
        KVGATE, "serve", "--config", str(config), "--port", str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    gateway = GatewayProcess(proc, f"http://127.0.0.1:{port}")

    async def collect() -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            gateway.lines.append(raw.decode(errors="replace").rstrip())

    reader = asyncio.create_task(collect())
    try:
        yield gateway
    finally:
        if proc.returncode is None:
            proc.kill()  # its server processes get SIGTERM from the kernel (PDEATHSIG)
            await proc.wait()
        await asyncio.wait_for(reader, 10)


async def _status(session: aiohttp.ClientSession, url: str) -> int:
    try:
        async with session.get(url) as resp:
            return resp.status
    except aiohttp.ClientError:
        return 0


async def _wait_ready(session: aiohttp.ClientSession, *gateways: GatewayProcess) -> None:
    async def ready() -> bool:
        statuses = await asyncio.gather(*(_status(session, g.url + "/readyz") for g in gateways))
        return all(status == 200 for status in statuses)

    await wait_until(ready, timeout=START_TIMEOUT_S, interval=0.05, message="gateways ready")


async def _chat(
    session: aiohttp.ClientSession, gateway: GatewayProcess, key: str, turns: list[str]
) -> tuple[str, str]:
    """One chat turn of session ``key``; (X-Kvgate-Worker, route reason)."""
    messages = [{"role": "system", "content": "You are a careful assistant."}]
    messages += [{"role": "user", "content": text} for text in turns]
    body = {"model": "demo", "messages": messages, "max_tokens": 4}
    async with session.post(
        gateway.url + "/v1/chat/completions", json=body, headers={"X-Session-ID": key}
    ) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return resp.headers["X-Kvgate-Worker"], resp.headers.get("X-Kvgate-Route-Reason", "")


async def _metric(
    session: aiohttp.ClientSession, gateway: GatewayProcess, name: str, *, required: bool = False
) -> float:
    """The sum of every series of metric ``name`` (with or without labels)."""
    async with session.get(gateway.url + "/metrics") as resp:
        text = await resp.text()
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    ]
    assert values or not required, f"{gateway.url} exports no {name}"
    return sum(values)


async def _fallbacks(session: aiohttp.ClientSession, *gateways: GatewayProcess) -> list[float]:
    """Store calls each gateway answered from its local map (Redis unreachable)."""
    name = "kvgate_store_fallbacks_total"
    return [await _metric(session, g, name, required=True) for g in gateways]


needs_redis = pytest.mark.skipif(find_redis_server() is None, reason="redis-server not installed")


@needs_redis
async def test_two_replicas_sharing_redis_place_every_session_identically(
    tmp_path: Path,
) -> None:
    sessions, turns = 16, 4
    with RedisServer() as redis:
        async with contextlib.AsyncExitStack() as stack:
            fleet = [
                await stack.enter_async_context(
                    running_worker(WorkerOptions(port=0, seed=i, profile="fast", time_scale=50.0))
                )
                for i in range(4)
            ]
            # One process each: two replicas, as two machines would run them. Generous
            # Redis timeouts, as in tests/store: on a loaded test machine two slow connects
            # in a row (250 ms each by default) turned a replica degraded, and a degraded
            # replica routes on its own by design (the retry itself is tested there).
            store = {"url": redis.url, "timeout_s": 1.0, "connect_timeout_s": 2.0}
            config = _config(tmp_path, "replica", fleet, store=store, listen={"processes": 1})
            a = await stack.enter_async_context(gateway_process(config, free_port()))
            b = await stack.enter_async_context(gateway_process(config, free_port()))
            replicas = (a, b)
            session = await stack.enter_async_context(aiohttp.ClientSession())
            await _wait_ready(session, a, b)

            placed: dict[str, str] = {}
            history: dict[str, list[str]] = {}
            # Turn 1 of every session goes through both replicas at once: a race on a
            # new session that compare-and-set must settle on one worker.
            for n in range(sessions):
                key = f"replica-session-{n}"
                history[key] = [f"Session {n} opens with its own question, number {n * 7919}."]
            firsts = await asyncio.gather(
                *(_chat(session, r, key, history[key]) for key in history for r in replicas)
            )
            for i, key in enumerate(history):
                (worker_a, _), (worker_b, _) = firsts[2 * i], firsts[2 * i + 1]
                # Replicas agree through Redis; one that found Redis unreachable (a
                # timeout tried twice) routes on its own, by design: say which it was.
                assert worker_a == worker_b, (
                    f"{key}: replicas disagree on a new session; "
                    f"fallbacks {await _fallbacks(session, a, b)}"
                )
                placed[key] = worker_a
            # Later turns alternate replicas; every session stays where it was bound.
            for turn in range(1, turns):
                for key, said in history.items():
                    said.append(f"Follow-up {turn} of {key}.")
                answers = await asyncio.gather(
                    *(
                        _chat(session, replicas[(turn + i) % 2], key, history[key])
                        for i, key in enumerate(history)
                    )
                )
                for key, (worker, reason) in zip(history, answers, strict=True):
                    assert worker == placed[key], f"{key} moved on turn {turn} ({reason})"
            assert len(set(placed.values())) > 1, "every session on one worker: no spread"
            for replica in replicas:
                assert await _metric(session, replica, "kvgate_store_errors_total") == 0
            assert await _fallbacks(session, a, b) == [0, 0]


@needs_redis
async def test_processes_sigterm_while_children_start_drains_all_and_exits_zero(
    tmp_path: Path,
) -> None:
    with RedisServer() as redis:
        await _sigterm_while_children_start(tmp_path, redis.url)


async def _sigterm_while_children_start(tmp_path: Path, store: str) -> None:
    async with running_worker(WorkerOptions(port=0, profile="fast", time_scale=50.0)) as worker:
        config = _config(tmp_path, "two", [worker], listen={"processes": 2}, store={"url": store})
        port = free_port()
        async with gateway_process(config, port) as gateway:
            await wait_until(
                lambda: len(gateway.server_children()) == 2,
                timeout=START_TIMEOUT_S,
                interval=0.005,
                message="two server processes spawned",
            )
            children = gateway.server_children()
            # Interpreters spawned a moment ago are still importing (about a second):
            # the stop arrives before either listens.
            gateway.proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(gateway.proc.wait(), START_TIMEOUT_S) == 0
        assert gateway.logged("listening on port") == 2
        assert gateway.logged("drained and exited") == 2
        for pid in children:
            assert not _exists(pid), f"server process {pid} outlived its parent"


@needs_redis
async def test_processes_report_a_dead_child_and_fail_when_all_die(tmp_path: Path) -> None:
    with RedisServer() as redis:
        await _dead_child_reported(tmp_path, redis.url)


async def _dead_child_reported(tmp_path: Path, store: str) -> None:
    async with running_worker(WorkerOptions(port=0, profile="fast", time_scale=50.0)) as worker:
        config = _config(tmp_path, "two", [worker], listen={"processes": 2}, store={"url": store})
        async with (
            gateway_process(config, free_port()) as gateway,
            aiohttp.ClientSession() as session,
        ):
            await _wait_ready(session, gateway)
            await wait_until(
                lambda: gateway.logged("listening on port") == 2,
                timeout=START_TIMEOUT_S,
                message="both server processes listening",
            )
            first, second = gateway.server_children()
            os.kill(first, signal.SIGKILL)
            await wait_until(
                lambda: gateway.logged("died unexpectedly") == 1,
                timeout=START_TIMEOUT_S,
                message="the dead server process reported",
            )
            assert gateway.proc.returncode is None
            # The survivor still serves on the shared port.
            worker_id, _ = await _chat(session, gateway, "after-death", ["still there?"])
            assert worker_id == worker.url
            os.kill(second, signal.SIGKILL)
            assert await asyncio.wait_for(gateway.proc.wait(), START_TIMEOUT_S) == 1
        assert gateway.logged("every gateway process has exited") == 1


async def test_several_processes_on_the_memory_store_are_refused_at_start(tmp_path: Path) -> None:
    config = _config(tmp_path, "mem", [], listen={"processes": 2})
    proc = await asyncio.create_subprocess_exec(
        KVGATE, "serve", "--config", str(config), "--worker", "http://127.0.0.1:9",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), START_TIMEOUT_S)
    assert proc.returncode == 2
    assert b"cannot share the memory store" in err
