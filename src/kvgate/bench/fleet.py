"""A fleet of emulated workers as child processes, and a router started in front of it.

What ``benchmarks/peers.py`` and the judge's live runs (``kvgate.judge.live``) share:
fresh ``kvgate worker-sim`` processes (cold caches) with per-worker latency
profiles, a router from ``kvgate.bench.routers`` started before them and waited
for until it routes, the workers' own counters read from their ``/metrics``
(finished requests, prefill computed, model time lost to a busy machine), and a
worker's speed changed mid-run through ``POST /admin/faults``. ``benchmarks/affinity_live.py``
starts its own fleet and gateway as the same children (``spawn``, ``wait_answering``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvgate.bench.processes import free_port
from kvgate.bench.routers import KVGATE, MODEL, Launch, Router
from kvgate.waiting import wait_until

MAX_MODEL_LEN = 262_144
"""Long-context prompts must not be refused by the emulated workers."""


@dataclass(frozen=True)
class FleetSpec:
    """The emulated workers: one latency profile each, their KV, block size and time scale.

    ``kv_blocks`` 0 is what each profile's GPU holds; ``time_scale`` the workers'
    model seconds per real second; worker ``i`` is seeded ``seed * 100 + i``.
    """

    profiles: Sequence[str]
    block_size: int = 16
    kv_blocks: int = 0
    time_scale: float = 1.0
    seed: int = 0
    max_model_len: int = MAX_MODEL_LEN
    cpu_offload_blocks: int = 0
    """Each worker's CPU offload tier in blocks (0: none): KV offloaded there is kept."""


class Child:
    """A child process of the benchmark, stopped with SIGTERM (then SIGKILL)."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str, log: Path) -> None:
        self.proc = proc
        self.name = name
        self.log = log

    async def stop(self, timeout_s: float = 20.0) -> int:
        """Terminate and wait; the exit status."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        return self.proc.returncode or 0

    def check(self) -> None:
        """Raise if the process has exited (with the end of its log)."""
        if self.proc.returncode is not None:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(
                f"{self.name} exited with {self.proc.returncode}: {' | '.join(tail)}"
            )


async def spawn(argv: Sequence[str], name: str, log: Path) -> Child:
    """Start ``argv`` with its output to ``log``."""
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out
        )
    return Child(proc, name, log)


@contextlib.asynccontextmanager
async def emulated_fleet(spec: FleetSpec, logs: Path) -> AsyncIterator[list[str]]:
    """Fresh emulated workers (cold caches) for the block; their URLs."""
    children: list[Child] = []
    try:
        urls = []
        ports: set[int] = set()
        for i, profile in enumerate(spec.profiles):
            # A worker binds its port only once started: until then the OS may hand the
            # same free port out again (it did, and kvgate refused a fleet naming a
            # worker twice).
            port = free_port()
            while port in ports:
                port = free_port()
            ports.add(port)
            argv = [
                KVGATE, "worker-sim", "--port", str(port), "--profile", profile,
                "--block-size", str(spec.block_size), "--time-scale", str(spec.time_scale),
                "--seed", str(spec.seed * 100 + i), "--max-model-len", str(spec.max_model_len),
                "--log-level", "warning",
            ]  # fmt: skip
            if spec.kv_blocks:
                argv += ["--kv-blocks", str(spec.kv_blocks)]
            if spec.cpu_offload_blocks:
                argv += ["--cpu-offload-blocks", str(spec.cpu_offload_blocks)]
            children.append(await spawn(argv, f"worker {i}", logs / f"worker-{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        health = [url + "/health" for url in urls]
        await wait_answering(children, health, within_s=90, interval=0.1, message="workers healthy")
        yield urls
    finally:
        await asyncio.gather(*(child.stop() for child in children))


async def _ok(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def wait_answering(
    children: Sequence[Child],
    urls: Sequence[str],
    *,
    within_s: float,
    interval: float,
    message: str,
) -> None:
    """Wait until every one of ``urls`` answers 200; raise at once if a child exits."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:

        async def ready() -> bool:
            for child in children:
                child.check()
            return all(await asyncio.gather(*(_ok(session, url) for url in urls)))

        await wait_until(ready, timeout=within_s, interval=interval, message=message)


async def _probe(session: aiohttp.ClientSession, base: str) -> bool:
    """A one-token completion naming the model: answered means the router routes.

    The prompt is shorter than one KV block, so it caches nothing.
    """
    body = {"model": MODEL, "prompt": "ping", "max_tokens": 1}
    try:
        async with session.post(base + "/v1/completions", json=body) as resp:
            await resp.read()
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _models(session: aiohttp.ClientSession, base: str) -> list[str]:
    try:
        async with session.get(base + "/v1/models") as resp:
            data = await resp.json(content_type=None)
            return [str(m.get("id")) for m in data.get("data", [])]
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
        return []


@contextlib.asynccontextmanager
async def router_in_front(
    router: Router,
    venv: Path | None,
    urls: Sequence[str],
    seed: int,
    logs: Path,
    *,
    time_scale: float = 1.0,
    offload_tier: bool = False,
) -> AsyncIterator[tuple[str, list[str]]]:
    """``router`` started in front of ``urls``; its URL and the models it lists.

    Ready when it lists the model, or (sglang-router lists emulated workers as
    ``unknown``) when a probe naming the model is answered.
    """
    launch = Launch(urls, free_port(), free_port(), logs, seed, venv, time_scale, offload_tier)
    child = await spawn(router.argv(launch), router.name, logs / f"{router.name}.log")
    base = f"http://127.0.0.1:{launch.port}"
    listed: list[str] = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:

            async def ready() -> bool:
                nonlocal listed
                child.check()
                listed = await _models(session, base)
                return MODEL in listed or await _probe(session, base)

            await wait_until(ready, timeout=120, interval=0.2, message=f"{router.name} ready")
        yield base, listed
    finally:
        await child.stop()


async def worker_counters(urls: Sequence[str]) -> list[tuple[int, float, float]]:
    """Each worker's finished requests, the model seconds its timeline lost and the
    prompt tokens it computed so far."""
    counts = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        for url in urls:
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
            counts.append((requests_served(text), lost_model_seconds(text), prefilled(text)))
    return counts


async def set_speed(url: str, speed: float) -> None:
    """Run worker ``url``'s engine at ``speed`` times its profile's rate from now on."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.post(url + "/admin/faults", json={"speed": speed}) as resp,
    ):
        if resp.status != 200:
            raise RuntimeError(f"{url} refused speed {speed}: {await resp.text()}")


def _total(metrics_text: str, sample_name: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == sample_name
    )


def requests_served(metrics_text: str) -> int:
    """The sum of ``vllm:request_success_total`` over its labels in a /metrics page."""
    return int(_total(metrics_text, "vllm:request_success_total"))


def prefilled(metrics_text: str) -> float:
    """Prompt tokens a worker computed rather than found cached (vLLM's prefix-cache
    counters: tokens queried less tokens hit, both counted at each admission).

    Summed over the fleet it is the prefill every router made it do, whatever sent
    it: the clients' requests, kvgate's warm-ups (``core.warmup``), and a preempted
    request's recompute. (Prompt tokens less hits would not be: an engine counts a
    prompt once, at its first token, but its hits again at every admission, and a
    fleet that preempted read negative.)
    """
    queried = _total(metrics_text, "vllm:prefix_cache_queries_total")
    return queried - _total(metrics_text, "vllm:prefix_cache_hits_total")


def lost_model_seconds(metrics_text: str) -> float:
    """Model seconds a worker's timeline skipped because its process fell behind.

    Time the engine computed nothing while requests waited: it inflates model-clock
    latencies, so a run where it is large measured the machine, not the router.
    """
    return _total(metrics_text, "kvgate_workersim_timeline_lost_model_seconds_total")
