"""What the gateway adds: the same load sent directly to emulated workers and through it.

Runs emulated workers (``kvgate worker-sim``, high time scale) and the gateway
(``kvgate serve``) as subprocesses, then drives small non-streaming and
streaming requests at each concurrency from several client processes, first
straight at the workers (spread evenly), then through the gateway. Prints the
added latency (p50/p99), the added time to first byte for streams, the
throughput ratio, and the gateway process's CPU time per request (from
``/proc/<pid>/stat``).

    .venv/bin/python benchmarks/overhead.py --duration 5 --concurrency 32,256

With ``--rollout`` half the workers serve version v2 and a canary rollout v1 -> v2
holds at 50% for the whole run (its step never ends), so the numbers include
version assignment, the per-version snapshot filter and outcome recording.

With ``--compare-rollout`` two gateways run on the same workers (half v1, half
v2), one with that rollout and one without, and each load level is driven
against the workers directly, then each gateway, back to back, ``--repeat``
times: both rows side by side, with the rollout gateway's CPU per request as a
ratio of the plain one's.

    .venv/bin/python benchmarks/overhead.py --duration 5 --concurrency 32 --compare-rollout

With ``--side-by-side`` (``side_by_side.py``) kvgate with 1 and ``--processes``
processes runs beside HAProxy, sglang-router and vllm-router on fast mock
workers, loaded by ``wrk``, plain and streamed, interleaved over ``--repeat``:

    .venv/bin/python benchmarks/overhead.py --side-by-side --duration 3 --repeat 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

import side_by_side
from kvgate.bench.processes import cpu_seconds, free_port, running

KVGATE = str(Path(sys.executable).parent / "kvgate")


@dataclass
class Result:
    """Latencies (seconds) of one load run, plus its wall time and error count."""

    latencies: list[float]
    ttfts: list[float]
    errors: int
    elapsed: float

    @property
    def throughput(self) -> float:
        """Completed requests per second."""
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _drive(
    urls: list[str], concurrency: int, duration: float, stream: bool, offset: int
) -> tuple[list[float], list[float], int]:
    body = {"model": "demo", "prompt": "hello world", "max_tokens": 16 if stream else 4}
    if stream:
        body["stream"] = True
    latencies: list[float] = []
    ttfts: list[float] = []
    errors = 0
    deadline = time.monotonic() + duration
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def loop(slot: int) -> None:
            nonlocal errors
            url = urls[(slot + offset) % len(urls)] + "/v1/completions"
            while time.monotonic() < deadline:
                start = time.perf_counter()
                first: float | None = None
                try:
                    async with session.post(url, json=body) as resp:
                        async for _chunk in resp.content.iter_any():
                            if first is None:
                                first = time.perf_counter() - start
                        ok = resp.status == 200
                except aiohttp.ClientError:
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - start)
                    ttfts.append(first or 0.0)
                else:
                    errors += 1

        await asyncio.gather(*(loop(i) for i in range(concurrency)))
    return latencies, ttfts, errors


def _client(
    args: tuple[list[str], int, float, bool, int],
) -> tuple[list[float], list[float], int]:
    urls, concurrency, duration, stream, offset = args
    try:
        import uvloop

        return uvloop.run(_drive(urls, concurrency, duration, stream, offset))  # type: ignore[no-any-return]
    except ImportError:
        return asyncio.run(_drive(urls, concurrency, duration, stream, offset))


def run_load(
    urls: list[str], concurrency: int, duration: float, stream: bool, clients: int
) -> Result:
    """Drive ``concurrency`` closed-loop requesters spread over ``clients`` processes."""
    shares = [concurrency // clients + (i < concurrency % clients) for i in range(clients)]
    jobs = [(urls, n, duration, stream, i) for i, n in enumerate(shares) if n]
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(len(jobs)) as pool:
        parts = pool.map(_client, jobs)
    elapsed = time.perf_counter() - start
    return Result(
        latencies=[x for p in parts for x in p[0]],
        ttfts=[x for p in parts for x in p[1]],
        errors=sum(p[2] for p in parts),
        elapsed=elapsed,
    )


def start_rollout(gateway_url: str) -> None:
    """A rollout of demo v1 -> v2 parked at 50% (admin API on loopback needs no token)."""
    spec = {
        "model": "demo",
        "baseline": "v1",
        "canary": "v2",
        "steps": [50, 100],
        "min_step_duration_s": 1e9,
        "interval_s": 1.0,
    }

    async def post() -> None:
        async with (
            aiohttp.ClientSession() as s,
            s.post(gateway_url + "/admin/rollouts", json=spec) as r,
        ):
            if r.status != 201:
                raise SystemExit(f"could not start the rollout: {r.status} {await r.text()}")

    asyncio.run(post())


def measure(name: str, direct: Result, through: Result, cpu: float, stream: bool) -> dict[str, Any]:
    """One row: what the gateway added to ``direct`` (``cpu``: the gateway's CPU seconds)."""
    d50, d99 = quantile(direct.latencies, 0.5), quantile(direct.latencies, 0.99)
    g50, g99 = quantile(through.latencies, 0.5), quantile(through.latencies, 0.99)
    ttft = statistics.median(through.ttfts or [0.0]) - statistics.median(direct.ttfts or [0.0])
    return {
        "load": name,
        "direct_p50_ms": d50 * 1e3,
        "direct_p99_ms": d99 * 1e3,
        "gateway_p50_ms": g50 * 1e3,
        "gateway_p99_ms": g99 * 1e3,
        "added_p50_ms": (g50 - d50) * 1e3,
        "added_p99_ms": (g99 - d99) * 1e3,
        "added_ttft_p50_ms": ttft * 1e3 if stream else None,
        "direct_rps": direct.throughput,
        "gateway_rps": through.throughput,
        "throughput_ratio": through.throughput / max(direct.throughput, 1e-9),
        "cpu_ms_per_req": 1000 * cpu / max(1, len(through.latencies)),
        "errors": direct.errors + through.errors,
    }


def compare_rollout(
    urls: list[str], plain: tuple[int, str], rollout: tuple[int, str], opts: argparse.Namespace
) -> list[dict[str, object]]:
    """Each load level against the workers, the plain gateway and the rollout one, in turn."""
    print(
        f"{'load':<16}{'run':>4}{'direct p50 ms':>15}{'added p50 plain/rollout':>26}"
        f"{'cpu ms/req plain/rollout':>27}{'cpu ratio':>11}{'errors':>8}"
    )
    rows: list[dict[str, object]] = []
    for stream in (False, True):
        for level in [int(x) for x in opts.concurrency.split(",")]:
            name = f"{'stream' if stream else 'plain'} c={level}"
            for run in range(1, opts.repeat + 1):
                direct = run_load(urls, level, opts.duration, stream, opts.clients)
                measured: dict[bool, dict[str, Any]] = {}
                # Alternate which gateway goes first, so drift in the machine's load
                # does not always favour the same one.
                for is_rollout in (False, True) if run % 2 else (True, False):
                    pid, url = rollout if is_rollout else plain
                    before = cpu_seconds(pid)
                    through = run_load([url], level, opts.duration, stream, opts.clients)
                    cpu = cpu_seconds(pid) - before
                    measured[is_rollout] = measure(name, direct, through, cpu, stream)
                a, b = measured[False], measured[True]
                ratio = b["cpu_ms_per_req"] / max(a["cpu_ms_per_req"], 1e-9)
                print(
                    f"{name:<16}{run:>4}{a['direct_p50_ms']:>15.2f}"
                    f"{a['added_p50_ms']:>14.2f}/{b['added_p50_ms']:<11.2f}"
                    f"{a['cpu_ms_per_req']:>15.3f}/{b['cpu_ms_per_req']:<11.3f}"
                    f"{ratio:>11.2f}{a['errors'] + b['errors']:>8}"
                )
                rows.append({"run": run, "rollout": False, **a})
                rows.append({"run": run, "rollout": True, **b})
    return rows


def main() -> None:
    """Parse options, run every scenario, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--concurrency", default="32,256")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=2, help="load generator processes")
    parser.add_argument("--time-scale", type=float, default=1000.0)
    # Round robin spreads load as the direct runs do, so only the overhead differs.
    parser.add_argument("--policy", default="round_robin")
    parser.add_argument(
        "--rollout", action="store_true", help="run with a canary rollout active (v1 -> v2 at 50%%)"
    )
    parser.add_argument(
        "--compare-rollout",
        action="store_true",
        help="run a gateway without and one with the rollout, back to back, side by side",
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs per level (--compare-rollout)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="kvgate beside HAProxy, sglang-router and vllm-router on mock workers, with wrk",
    )
    parser.add_argument("--processes", type=int, default=2, help="kvgate's N (--side-by-side)")
    parser.add_argument(
        "--servers",
        default="llhttp,aiohttp",
        help="kvgate's servers of the generation endpoints, each run (--side-by-side)",
    )
    parser.add_argument(
        "--routers",
        default="",
        help="only these (--side-by-side; comma list of haproxy, kvgate, kvgate-redis "
        "(one process on Redis), kvgate-n, sglang-router, vllm-router; empty: all but "
        "kvgate-redis)",
    )
    parser.add_argument(
        "--kvgate-src",
        action="append",
        default=[],
        metavar="NAME=SRC",
        help="also run kvgate (1 process) from this source tree, as 'kvgate NAME' "
        "(--side-by-side; repeatable: before/after rows in one interleaved run)",
    )
    parser.add_argument("--peer-policy", default="round_robin", help="the Rust routers' policy")
    parser.add_argument(
        "--sessions",
        type=int,
        default=0,
        help="requests name one of this many sessions in turn (X-Session-ID; --side-by-side)",
    )
    parser.add_argument("--events", type=int, default=16, help="SSE events per mock stream")
    parser.add_argument(
        "--event-gap-ms",
        type=float,
        default=0.0,
        help="pause between a mock stream's events (0: as fast as the router takes them)",
    )
    parser.add_argument("--ttft-requests", type=int, default=200, help="streams timed at c=1")
    opts = parser.parse_args()
    if opts.side_by_side:
        if opts.concurrency == "32,256":
            opts.concurrency = "1,32,256"
        side_by_side.run(opts)
        return
    split = opts.rollout or opts.compare_rollout
    levels = [int(x) for x in opts.concurrency.split(",")]

    with contextlib.ExitStack() as stack:
        urls = []
        for i in range(opts.workers):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            stack.enter_context(
                running(
                    [
                        KVGATE,
                        "worker-sim",
                        "--port",
                        str(port),
                        "--profile",
                        "fast",
                        "--time-scale",
                        str(opts.time_scale),
                        "--seed",
                        str(i),
                        "--version",
                        "v2" if split and i % 2 else "v1",
                        "--log-level",
                        "warning",
                    ],
                    url + "/health",
                    timeout=30,
                    interval=0.1,
                )
            )
            urls.append(url)
        gport = free_port()
        gateway_url = f"http://127.0.0.1:{gport}"
        serve = [KVGATE, "serve", "--port", str(gport), "--policy", opts.policy]
        for url in urls:
            serve += ["--worker", url]
        gateway = stack.enter_context(
            running(serve, gateway_url + "/readyz", timeout=30, interval=0.1)
        )
        if opts.compare_rollout:
            rport = free_port()
            rollout_url = f"http://127.0.0.1:{rport}"
            rserve = [*serve]
            rserve[rserve.index("--port") + 1] = str(rport)
            rollout_gw = stack.enter_context(
                running(rserve, rollout_url + "/readyz", timeout=30, interval=0.1)
            )
            start_rollout(rollout_url)
            print(
                f"{opts.workers} workers (fast, x{opts.time_scale:g}, half v1, half v2), "
                f"{opts.clients} client processes, {opts.duration:g}s per run, "
                f"{os.cpu_count()} CPUs, policy {opts.policy}, load average "
                f"{os.getloadavg()[0]:.2f}; gateways without and with a rollout v1 -> v2 at 50%"
            )
            compared = compare_rollout(
                urls, (gateway.pid, gateway_url), (rollout_gw.pid, rollout_url), opts
            )
            print(f"load average at the end {os.getloadavg()[0]:.2f}")
            if opts.json is not None:
                meta = {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), **vars(opts)}
                meta["json"] = str(opts.json)
                opts.json.write_text(
                    json.dumps({"options": meta, "rows": compared}, indent=2) + "\n"
                )
            return
        if opts.rollout:
            start_rollout(gateway_url)

        print(
            f"{opts.workers} workers (fast, x{opts.time_scale:g}), {opts.clients} client "
            f"processes, {opts.duration:g}s per run, {os.cpu_count()} CPUs, policy {opts.policy}"
            + (", rollout v1 -> v2 at 50%" if opts.rollout else "")
        )
        header = (
            f"{'load':<16}{'direct p50/p99 ms':>20}{'gateway p50/p99 ms':>21}"
            f"{'added p50/p99 ms':>19}{'added ttft p50':>16}{'thru ratio':>12}"
            f"{'cpu ms/req':>12}{'errors':>8}"
        )
        print(header)
        rows: list[dict[str, object]] = []
        for stream in (False, True):
            for level in levels:
                direct = run_load(urls, level, opts.duration, stream, opts.clients)
                before = cpu_seconds(gateway.pid)
                through = run_load([gateway_url], level, opts.duration, stream, opts.clients)
                cpu = cpu_seconds(gateway.pid) - before
                name = f"{'stream' if stream else 'plain'} c={level}"
                row = measure(name, direct, through, cpu, stream)
                ttft = row["added_ttft_p50_ms"]
                print(
                    f"{name:<16}{row['direct_p50_ms']:>9.2f}/{row['direct_p99_ms']:<10.2f}"
                    f"{row['gateway_p50_ms']:>10.2f}/{row['gateway_p99_ms']:<10.2f}"
                    f"{row['added_p50_ms']:>8.2f}/{row['added_p99_ms']:<10.2f}"
                    f"{(ttft if ttft is not None else float('nan')):>16.2f}"
                    f"{row['throughput_ratio']:>12.2f}"
                    f"{row['cpu_ms_per_req']:>12.3f}{row['errors']:>8}"
                )
                print(
                    f"{'':<16}direct {direct.throughput:,.0f} req/s, "
                    f"gateway {through.throughput:,.0f} req/s"
                )
                rows.append(row)
        if opts.json is not None:
            meta = {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), **vars(opts)}
            meta["json"] = str(opts.json)
            opts.json.write_text(json.dumps({"options": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
