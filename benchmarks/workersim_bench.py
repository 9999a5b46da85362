"""How many small requests per second one worker-sim serves.

Starts ``kvgate worker-sim`` as its own process (on uvloop) at a time scale large
enough that model time is negligible, then drives it from separate client
processes, each running many concurrent aiohttp requests, so the client is not the
bottleneck. Measures non-streamed and streamed chat completions.

    .venv/bin/python benchmarks/workersim_bench.py [--seconds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from kvgate.testing import free_port, wait_until_sync


@dataclass
class ClientResult:
    """What one client process saw."""

    ok: int
    errors: int
    seconds: float
    latencies: list[float]
    cpu_seconds: float


@dataclass(frozen=True)
class Load:
    """What one client process sends: where, how many at once, for how long."""

    url: str
    concurrency: int
    seconds: float
    warmup: float
    stream: bool
    max_tokens: int


@dataclass
class Scenario:
    """One measured run."""

    mode: str
    requests_per_s: float
    ok: int
    errors: int
    p50_ms: float
    p99_ms: float
    clients: int
    concurrency: int
    server_cpu_us_per_request: float | None
    """Worker-sim CPU time per request: robust to other load on the machine."""
    client_cpu_us_per_request: float
    """Client CPU per request (whole run, warm-up included): is the client the limit?"""

    @property
    def requests_per_cpu_s(self) -> float | None:
        """Requests one fully available core would serve, from the CPU time measured."""
        cpu = self.server_cpu_us_per_request
        return 1e6 / cpu if cpu else None


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``), else ``None``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _body(i: int, stream: bool, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "bench",
        "messages": [{"role": "user", "content": f"small request {i % 97}: say hi"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def _client(load: Load) -> ClientResult:
    url, concurrency, stream, max_tokens = load.url, load.concurrency, load.stream, load.max_tokens
    connector = aiohttp.TCPConnector(limit=concurrency)
    ok = errors = 0
    latencies: list[float] = []
    start = time.perf_counter()
    measure_from = start + load.warmup
    stop_at = measure_from + load.seconds

    async def one(session: aiohttp.ClientSession, task: int) -> None:
        nonlocal ok, errors
        i = task
        while time.perf_counter() < stop_at:
            began = time.perf_counter()
            try:
                async with session.post(url, json=_body(i, stream, max_tokens)) as response:
                    await response.read()
                    good = response.status == 200
            except aiohttp.ClientError:
                good = False
            ended = time.perf_counter()
            i += concurrency
            if began < measure_from or ended > stop_at:
                continue
            if good:
                ok += 1
                latencies.append(ended - began)
            else:
                errors += 1

    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one(session, t) for t in range(concurrency)))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return ClientResult(ok, errors, load.seconds, latencies, usage.ru_utime + usage.ru_stime)


def _client_process(load: Load) -> ClientResult:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_client(load))
    return uvloop.run(_client(load))


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


def _run_scenario(mode: str, clients: int, load: Load, server_pid: int) -> Scenario:
    context = multiprocessing.get_context("spawn")
    with context.Pool(clients) as pool:
        # Sample the server's CPU over the measured window only (after warm-up).
        pending = pool.map_async(_client_process, [load] * clients)
        time.sleep(load.warmup + 0.5)  # clients start within this slack
        cpu_start, wall_start = _cpu_seconds(server_pid), time.monotonic()
        time.sleep(load.seconds - 0.5)
        cpu_end, wall_end = _cpu_seconds(server_pid), time.monotonic()
        results = pending.get()
    seconds = load.seconds
    latencies = sorted(lat for r in results for lat in r.latencies)
    ok = sum(r.ok for r in results)
    per_request: float | None = None
    if cpu_start is not None and cpu_end is not None and ok:
        # Requests completed in the sampled window, assuming a steady rate.
        in_window = ok * (wall_end - wall_start) / seconds
        per_request = 1e6 * (cpu_end - cpu_start) / in_window
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0
    return Scenario(
        mode=mode,
        requests_per_s=ok / seconds,
        ok=ok,
        errors=sum(r.errors for r in results),
        p50_ms=1000 * statistics.median(latencies) if latencies else 0.0,
        p99_ms=1000 * p99,
        clients=clients,
        concurrency=load.concurrency,
        server_cpu_us_per_request=per_request,
        client_cpu_us_per_request=1e6 * sum(r.cpu_seconds for r in results) / max(ok, 1),
    )


def main() -> None:
    """Run the benchmark and print (and optionally save) its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per mode")
    parser.add_argument("--clients", type=int, default=1, help="client processes")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight each")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=1000.0)
    parser.add_argument("--profile", default="h100-llama3-8b")
    parser.add_argument("--modes", default="plain,stream", help="plain and/or stream")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "kvgate.cli", "worker-sim", "--port", str(port)),
            *("--model", "bench", "--profile", args.profile),
            *("--time-scale", str(args.time_scale), "--max-num-seqs", "256"),
            *("--log-level", "warning"),
        ],
        stdout=subprocess.DEVNULL,
    )
    scenarios: list[Scenario] = []
    try:
        wait_until_sync(lambda: _healthy(url), timeout=30, message="worker-sim to start")
        for mode in args.modes.split(","):
            load = Load(
                url=url + "/v1/chat/completions",
                concurrency=args.concurrency,
                seconds=args.seconds,
                warmup=1.0,
                stream=mode == "stream",
                max_tokens=args.max_tokens,
            )
            scenarios.append(_run_scenario(mode, args.clients, load, server.pid))
    finally:
        server.terminate()
        server.wait(timeout=10)

    table = Table(
        title=f"worker-sim throughput ({args.profile} at {args.time_scale:g}x, "
        f"{args.max_tokens} output tokens, {args.clients}x{args.concurrency} in flight)"
    )
    columns = (
        *("mode", "req/s", "ok", "errors", "p50 ms", "p99 ms"),
        *("server CPU µs/req", "req/server-CPU-s", "client CPU µs/req"),
    )
    for column in columns:
        table.add_column(column, justify="right")
    for s in scenarios:
        table.add_row(
            s.mode,
            f"{s.requests_per_s:,.0f}",
            str(s.ok),
            str(s.errors),
            f"{s.p50_ms:.1f}",
            f"{s.p99_ms:.1f}",
            f"{s.server_cpu_us_per_request:.0f}" if s.server_cpu_us_per_request else "-",
            f"{s.requests_per_cpu_s:,.0f}" if s.requests_per_cpu_s else "-",
            f"{s.client_cpu_us_per_request:.0f}",
        )
    Console().print(table)
    if args.json is not None:
        payload = {
            "benchmark": "workersim",
            "profile": args.profile,
            "time_scale": args.time_scale,
            "max_tokens": args.max_tokens,
            "seconds": args.seconds,
            "measured_at": time.time(),
            "scenarios": [
                asdict(s) | {"requests_per_cpu_s": s.requests_per_cpu_s} for s in scenarios
            ],
        }
        args.json.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
