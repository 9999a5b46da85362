"""The live affinity benchmark: every policy through the real gateway, then replicas.

Four emulated workers (``kvgate worker-sim`` subprocesses, a realistic latency
profile, time-scaled, a KV cache of a few conversations each) serve a multi-turn
chat workload in which every session carries its own document behind one of a few
system prompts shared across sessions. For each policy a fresh fleet (restarted:
cold caches) and a fresh ``kvgate serve`` subprocess run the same seeded workload
through ``kvgate.bench.run_bench``: prefix-cache hit rate (the workers' own
``cached_tokens``), mean and p99 TTFT (model seconds), against the infinite-cache
bound. Then the default policy again behind ``kvgate serve --processes 4`` sharing
a redis-server this benchmark starts. ``--workload headerless`` runs the same on
traffic without session ids behind one shared opening, where replicas agree only
through the conversation's own blocks (the store's prefix holders). Nothing is
adjusted: the table shows what was measured, and the targets are checked against it.

    .venv/bin/python benchmarks/affinity_live.py --json /tmp/affinity_live.json
    .venv/bin/python benchmarks/affinity_live.py --workload headerless \
        --policies default,prefix_affinity,round_robin --json /tmp/affinity_headerless.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from kvgate.bench import run_bench, workload_bound
from kvgate.bench.fleet import spawn, wait_answering
from kvgate.bench.report import results_document
from kvgate.core.policies import default_registry, with_time_scale
from kvgate.testing import free_port
from kvgate.testing_redis import RedisServer
from kvgate.workload.options import write_results
from kvgate.workload.synthetic import build_workload

KVGATE = str(Path(sys.executable).parent / "kvgate")

POLICIES = (
    "round_robin",
    "least_request",
    "session_affinity",
    "prefix_affinity",
    "consistent_hash",
    "default",
)
STATELESS = ("round_robin", "least_request", "consistent_hash")
"""The policies that keep no per-session or per-prefix state."""

WORKLOAD = (
    "chat:rate=8,think_s=3,turns_mean=6,system_prompts=4,system_tokens=512,"
    "doc_tokens=1200,user_tokens=150,output_tokens=60"
)
"""Sessions of about six turns, each opening with its own ~1,200-token document behind
one of four shared 512-token system prompts: a session's context (2-3k tokens) fits a
worker many times over, the fleet's live sessions do not fit one worker's cache."""

HEADERLESS = (
    "shared-opening-trace:rate=4,opening_tokens=512,block_tokens=128,first_blocks=10,"
    "turn_blocks=3,turns_mean=5,think_s=3,output_tokens=40"
)
"""Issue 11's shape, small: no session ids, every prompt opening with the same 512-token
block, each conversation extending its own chain (``--workload headerless``). Replicas
can agree only through the conversation's own blocks (the store's prefix holders)."""

WORKLOADS = {"sessions": WORKLOAD, "headerless": HEADERLESS}
"""Named workloads of ``--workload``; anything else is a workload spec."""

REPLICAS_LABEL = "default x{n} (redis)"


@dataclass(frozen=True)
class Options:
    """What one benchmark run is made of."""

    workers: int
    profile: str
    kv_blocks: int
    block_size: int
    time_scale: float
    workload: str
    requests: int
    seed: int
    concurrency: int
    processes: int
    policies: Sequence[str]
    chars_per_token: int


@contextlib.asynccontextmanager
async def fleet(opts: Options, ports: Sequence[int], logs: Path) -> AsyncIterator[list[str]]:
    """Fresh emulated workers (cold caches) on ``ports`` for the block; their URLs."""
    procs = []
    try:
        for i, port in enumerate(ports):
            args = [
                KVGATE, "worker-sim", "--port", str(port), "--profile", opts.profile,
                "--kv-blocks", str(opts.kv_blocks), "--block-size", str(opts.block_size),
                "--time-scale", str(opts.time_scale), "--seed", str(opts.seed + i),
                "--log-level", "warning",
            ]  # fmt: skip
            procs.append(await spawn(args, f"worker {port}", logs / f"worker-{i}.log"))
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        health = [url + "/health" for url in urls]
        await wait_answering(procs, health, within_s=60, interval=0.05, message=", ".join(health))
        yield urls
    finally:
        await asyncio.gather(*(proc.stop(30.0) for proc in procs))


@contextlib.asynccontextmanager
async def gateway(
    opts: Options,
    urls: Sequence[str],
    policy: str,
    logs: Path,
    *,
    processes: int = 1,
    store: str = "memory",
) -> AsyncIterator[str]:
    """``kvgate serve`` in front of ``urls`` for the block; its URL. Must exit 0."""
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port, "processes": processes},
        "workers": [{"url": url, "model": "demo"} for url in urls],
        "expose_worker_urls": True,  # answers are attributed to worker URLs
        "policy": {
            "name": policy,
            "options": with_time_scale(default_registry(), policy, {}, opts.time_scale),
        },
        "store": {"url": store},
        "health": {"interval_s": 0.2, "timeout_s": 1.0},
        "seed": opts.seed,
    }
    path = logs / f"gateway-{policy}-{processes}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = logs / f"gateway-{policy}-{processes}.log"
    proc = await spawn([KVGATE, "serve", "--config", str(path)], f"gateway {policy}", log)
    ready = f"http://127.0.0.1:{port}/readyz"
    try:
        await wait_answering([proc], [ready], within_s=60, interval=0.05, message=ready)
        yield f"http://127.0.0.1:{port}"
    finally:
        status = await proc.stop(30.0)
        if status != 0:
            raise RuntimeError(f"gateway ({policy}, {processes} processes) exited {status}: {log}")


async def _one(
    opts: Options,
    ports: Sequence[int],
    policy: str,
    *,
    label: str,
    logs: Path,
    console: Console,
    **serve: Any,
) -> dict[str, Any]:
    """One policy on a fresh fleet behind a fresh gateway: its summary."""
    workload = build_workload(opts.workload, opts.seed)
    started = time.monotonic()
    async with fleet(opts, ports, logs) as urls, gateway(opts, urls, policy, logs, **serve) as url:
        result = await run_bench(
            url,
            workload,
            requests=opts.requests,
            concurrency=opts.concurrency,
            model="demo",
            time_scale=opts.time_scale,
            label=label,
            workers=urls,
            block_size=opts.block_size,
            chars_per_token=opts.chars_per_token,
        )
    summary: dict[str, Any] = result["policies"][label]
    console.print(
        f"{label:>22}: hit {summary['hit_rate']:.1%}, TTFT mean {summary['ttft_mean'] * 1e3:.0f}ms "
        f"p99 {summary['ttft_p99'] * 1e3:.0f}ms, errors {summary['errors']} "
        f"({time.monotonic() - started:.0f}s)"
    )
    return summary


def check_targets(results: dict[str, Any], processes: int) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured figures and whether it was met."""
    runs = results["policies"]
    bound = float(results["bound_hit_rate"])
    checks: list[dict[str, Any]] = []
    default = runs.get("default")
    if default is None:
        return checks
    stateless = {name: runs[name] for name in STATELESS if name in runs}
    hit = default["hit_rate"]
    checks.append(
        {
            "target": "default hit rate >= 90% of the infinite-cache bound",
            "measured": f"{hit:.1%} = {hit / bound:.1%} of {bound:.1%}" if bound else "-",
            "met": bool(bound) and hit >= 0.9 * bound,
        }
    )
    if stateless:
        best = max(stateless, key=lambda n: stateless[n]["hit_rate"])
        checks.append(
            {
                "target": "default hit rate above every stateless policy's",
                "measured": f"{hit:.1%} vs best stateless {best} {stateless[best]['hit_rate']:.1%}",
                "met": all(hit > s["hit_rate"] for s in stateless.values()),
            }
        )
        # Client-observed TTFT includes this machine's CPU contention times the
        # time scale; the workers' own clock (kvgate_timing) is what routing changes.
        for key, where in (("ttft_p99", "client-observed"), ("worker_ttft_p99", "workers' clock")):
            if key not in default:
                continue
            fastest = min(stateless, key=lambda n: stateless[n].get(key, float("inf")))
            p99 = default[key]
            checks.append(
                {
                    "target": f"default p99 TTFT ({where}) below every stateless policy's",
                    "measured": f"{p99 * 1e3:.0f}ms vs best stateless {fastest} "
                    f"{stateless[fastest][key] * 1e3:.0f}ms",
                    "met": all(p99 < s[key] for s in stateless.values() if key in s),
                }
            )
    replicas = runs.get(REPLICAS_LABEL.format(n=processes))
    if replicas is not None:
        gap = replicas["hit_rate"] - hit
        checks.append(
            {
                "target": f"{processes} replicas sharing Redis within 2 points of one process",
                "measured": f"{replicas['hit_rate']:.1%} vs {hit:.1%} ({gap * 100:+.1f} points)",
                "met": abs(gap) <= 0.02,
            }
        )
    return checks


def policies_table(results: dict[str, Any]) -> Table:
    """One row per run: hit rate against the bound, TTFT mean/p50/p99, spread, errors."""
    bound = float(results["bound_hit_rate"])
    name = results["workload"]["name"]
    table = Table(title=f"{name}: infinite-cache bound hit rate {bound:.1%}", title_justify="left")
    columns = ("policy", "done", "hit", "/bound", "TTFT mean", "p50", "p99", "e2e p99",
               "max/mean", "errors", "shed", "worker TTFT mean", "p50", "p99")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for label, s in results["policies"].items():
        table.add_row(
            label,
            f"{s['finished']}/{s['requests']}",
            f"{s['hit_rate']:.1%}",
            f"{s['hit_rate'] / bound:.1%}" if bound else "-",
            f"{s['ttft_mean'] * 1e3:.0f}ms",
            f"{s['ttft_p50'] * 1e3:.0f}ms",
            f"{s['ttft_p99'] * 1e3:.0f}ms",
            f"{s['e2e_p99'] * 1e3:.0f}ms",
            f"{s['load_max_over_mean']:.2f}",
            str(s["errors"]),
            str(s["shed"]),
            *(
                f"{s[k] * 1e3:.0f}ms" if k in s else "-"
                for k in ("worker_ttft_mean", "worker_ttft_p50", "worker_ttft_p99")
            ),
        )
    return table


def targets_table(checks: Sequence[dict[str, Any]]) -> Table:
    """The targets, measured, met or not."""
    table = Table(title="targets", title_justify="left")
    for column in ("target", "measured", "met"):
        table.add_column(column)
    for check in checks:
        table.add_row(check["target"], check["measured"], "yes" if check["met"] else "NO")
    return table


async def run(opts: Options, logs: Path, console: Console) -> dict[str, Any]:
    """Every policy, then the replicas; one results document with the targets checked."""
    ports = [free_port() for _ in range(opts.workers)]
    runs: dict[str, dict[str, Any]] = {}
    for policy in opts.policies:
        runs[policy] = await _one(opts, ports, policy, label=policy, logs=logs, console=console)
    if opts.processes > 1:
        label = REPLICAS_LABEL.format(n=opts.processes)
        with RedisServer() as redis:
            runs[label] = await _one(
                opts,
                ports,
                "default",
                label=label,
                logs=logs,
                console=console,
                processes=opts.processes,
                store=redis.url,
            )
    workload = build_workload(opts.workload, opts.seed)
    bound = workload_bound(workload, opts.requests, opts.block_size)
    config = {
        "workers": opts.workers,
        "profile": opts.profile,
        "kv_blocks": opts.kv_blocks,
        "block_size": opts.block_size,
        "time_scale": opts.time_scale,
        "requests": opts.requests,
        "concurrency": opts.concurrency,
        "seed": opts.seed,
        "processes": opts.processes,
        "chars_per_token": opts.chars_per_token,
    }
    results = results_document(runs, workload=workload.describe(), bound=bound, config=config)
    results["targets"] = check_targets(results, opts.processes)
    return results


def main() -> None:
    """Parse options, run the benchmark, print the tables, write --json."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--profile", default="h100-llama3-8b")
    parser.add_argument("--kv-blocks", type=int, default=1000, help="per worker (small on purpose)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=10.0, help="model s per real s")
    parser.add_argument(
        "--workload", default="sessions", help=f"{' or '.join(WORKLOADS)}, or a workload spec"
    )
    parser.add_argument("--requests", type=int, default=400, help="per policy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--processes", type=int, default=4, help="replicas run (1: skip it)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--chars-per-token", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the results document here")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs here")
    args = parser.parse_args()
    opts = Options(
        workers=args.workers,
        profile=args.profile,
        kv_blocks=args.kv_blocks,
        block_size=args.block_size,
        time_scale=args.time_scale,
        workload=WORKLOADS.get(args.workload, args.workload),
        requests=args.requests,
        seed=args.seed,
        concurrency=args.concurrency,
        processes=args.processes,
        policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
        chars_per_token=args.chars_per_token,
    )
    build_workload(opts.workload, opts.seed)  # a bad workload spec fails before anything starts
    console = Console(width=200) if not Console().is_terminal else Console()
    console.print(
        f"{opts.workers} workers ({opts.profile}, {opts.kv_blocks} KV blocks of "
        f"{opts.block_size}, x{opts.time_scale:g}), {opts.requests} requests per policy, "
        f"workload {opts.workload}"
    )
    with contextlib.ExitStack() as stack:
        logs = args.logs or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        logs.mkdir(parents=True, exist_ok=True)
        results = asyncio.run(run(opts, logs, console))
    console.print(policies_table(results))
    console.print(targets_table(results["targets"]))
    if args.json is not None:
        write_results(args.json, results)
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
