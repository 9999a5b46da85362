"""Affinity store benchmark: memory footprint of MemoryStore and ops/s of both backends.

    .venv/bin/python benchmarks/store_bench.py [--sessions 1000000] [--ops 50000]
                                               [--redis-ops 10000] [--repeats 3] [--no-redis]
                                               [--no-cluster] [--holders 3000] [--only-holders]
                                               [--json PATH]

Footprint: 1M sessions (16 workers, 2 versions, 24-character keys) written through
the public async API, measured as RSS growth and as tracemalloc's live bytes.
Throughput: get and compare-and-set on MemoryStore, and on a redis-server started
on a free port and on a Redis Cluster (3 masters + 3 replicas) started on loopback:
one await at a time, 64 in flight, and in batches; median and range over repeats.
On the cluster, the share of commands the busiest master served (a figure a busy
machine cannot fake: 1.00 when every key sits on one master, 0.33 evenly over three).
Prefix holders (``--holders``): Redis's own time per block written and its memory per block
held, unbounded (plain SETs) and under ``store.max_holders_per_scope`` (a script per flush).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import statistics
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvgate.core.decision import Affinity
from kvgate.store import MemoryStore, RedisStore
from kvgate.store.scripts import Scripts
from kvgate.testing_redis import RedisClusterServers, RedisServer, find_redis_server

WORKERS = [f"http://10.0.{i // 8}.{i % 8}:8000" for i in range(16)]
VERSIONS = ["v2.1", "v3.0-beta"]
TTL = 3600.0
BATCH = 100
IN_FLIGHT = 64


def session(i: int) -> str:
    """A realistic session key: 24 characters, like a hashed X-Session-ID."""
    return f"sess-{i:019d}"


def affinity(i: int, worker_shift: int = 0) -> Affinity:
    """The binding for session ``i``."""
    return Affinity(session(i), WORKERS[(i + worker_shift) % 16], VERSIONS[i % 2], float(i))


def rss_bytes() -> int:
    """This process's resident set size, from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def fill(store: MemoryStore, n: int) -> None:
    """Write ``n`` sessions through the async API."""
    for i in range(n):
        await store.set(affinity(i), TTL)


async def footprint(n: int, with_tracemalloc: bool) -> dict[str, float]:
    """Bytes per session held by a MemoryStore of ``n`` sessions."""
    gc.collect()
    before = rss_bytes()
    store = MemoryStore(max_sessions=n)
    started = time.perf_counter()
    await fill(store, n)
    fill_s = time.perf_counter() - started
    gc.collect()
    rss = rss_bytes() - before
    result = {"sessions": n, "rss_mb": rss / 1e6, "rss_bytes_per_session": rss / n,
              "fill_s": fill_s, "sets_per_s": n / fill_s}  # fmt: skip
    started = time.perf_counter()
    counted = sum((await store.counts()).values())
    result["counts_s"] = time.perf_counter() - started
    started = time.perf_counter()
    oldest = await store.sessions_of(WORKERS[0], limit=100)
    result["sessions_of_100_s"] = time.perf_counter() - started
    assert counted == n and len(oldest) == 100
    await store.close()
    del store
    gc.collect()
    if with_tracemalloc:
        tracemalloc.start()
        store = MemoryStore(max_sessions=n)
        await fill(store, n)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        result["traced_mb"] = traced / 1e6
        result["traced_bytes_per_session"] = traced / n
        await store.close()
    return result


async def timed(
    label: str, n: int, one: Callable[[int], Awaitable[Any]], in_flight: int = 1
) -> dict[str, Any]:
    """Run ``one(i)`` for i < n with ``in_flight`` concurrent callers; ops/s and latency."""
    latencies: list[float] = []

    async def caller(offset: int) -> None:
        for i in range(offset, n, in_flight):
            started = time.perf_counter()
            await one(i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(caller(k) for k in range(in_flight)))
    elapsed = time.perf_counter() - started
    qs = statistics.quantiles(latencies, n=100)
    return {"op": label, "ops": n, "ops_per_s": n / elapsed,
            "p50_us": qs[49] * 1e6, "p99_us": qs[98] * 1e6}  # fmt: skip


async def batched(label: str, n: int, batch: Callable[[range], Awaitable[Any]]) -> dict[str, Any]:
    """Run ``batch`` over slices of ``BATCH`` indexes; ops/s counts single operations."""
    latencies: list[float] = []
    started = time.perf_counter()
    for low in range(0, n, BATCH):
        t0 = time.perf_counter()
        await batch(range(low, min(n, low + BATCH)))
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    qs = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {"op": f"{label} (batch {BATCH})", "ops": n, "ops_per_s": n / elapsed,
            "p50_us": qs[49] * 1e6, "p99_us": qs[98] * 1e6}  # fmt: skip


async def memory_ops(n: int) -> list[dict[str, Any]]:
    """get/CAS/touch throughput on MemoryStore."""
    store = MemoryStore()
    rows = [
        await timed("cas new (wins)", n, lambda i: store.compare_and_set(
            session(i), None, affinity(i), TTL)),
        await timed("cas existing (loses)", n, lambda i: store.compare_and_set(
            session(i), None, affinity(i, 1), TTL)),
        await timed("get hit", n, lambda i: store.get(session(i))),
        await timed("touch", n, lambda i: store.touch(session(i), float(i), TTL)),
    ]  # fmt: skip
    for row in rows:
        row["backend"] = "memory"
    await store.close()
    return rows


async def redis_ops(n: int, url: str, backend: str) -> list[dict[str, Any]]:
    """get/CAS throughput on one Redis or a Redis Cluster: sequential, concurrent, batched.

    On a cluster the sessions are spread over shard tags (``store.cluster``), each
    script on one slot; "batched" there is ``asyncio.gather`` of direct calls, as
    ``RedisStore`` does on a cluster, not a pipeline.
    """
    store = RedisStore(
        url, socket_timeout=2.0, connect_timeout=2.0, max_connections=IN_FLIGHT, prefix="bench:"
    )
    shards = [p.replace("bench", "bench-pipe", 1) for p in store._scripts.shards]
    scripts = Scripts(store._redis, "{bench}:pipe:" if store.cluster else "bench-pipe:", shards)

    async def cas_batched(indexes: range) -> None:
        if store.cluster:  # in slices the connection limit allows, as get_many does
            for low in range(indexes.start, indexes.stop, IN_FLIGHT // 2):
                part = range(low, min(indexes.stop, low + IN_FLIGHT // 2))
                await asyncio.gather(
                    *(scripts.compare_and_set(session(i), None, affinity(i), TTL) for i in part)
                )
            return
        pipe = store._redis.pipeline(transaction=False)
        for i in indexes:
            await scripts.compare_and_set(session(i), None, affinity(i), TTL, pipe)
        await pipe.execute()

    async def get_batched(indexes: range) -> None:
        await store.get_many([session(i) for i in indexes])

    mode = "gathered" if store.cluster else "pipelined"
    rows = [
        await timed("cas new (wins)", n, lambda i: store.compare_and_set(
            session(i), None, affinity(i), TTL)),
        await timed("get hit", n, lambda i: store.get(session(i))),
        await timed(f"cas new, {IN_FLIGHT} in flight", n, lambda i: store.compare_and_set(
            session(n + i), None, affinity(n + i), TTL), IN_FLIGHT),
        await timed(f"get hit, {IN_FLIGHT} in flight", n, lambda i: store.get(session(i)),
                    IN_FLIGHT),
        await batched(f"cas new, {mode}", n, cas_batched),
        await batched(f"get hit, {mode}", n, get_batched),
    ]  # fmt: skip
    errors = store.errors_total  # nonzero means some calls were served by the fallback
    await store.close()
    for row in rows:
        row["backend"] = backend
        row["store_errors_total"] = errors
    return rows


async def backend_ops(n: int, repeats: int, cluster: bool) -> list[dict[str, Any]]:
    """One Redis and (``cluster``) a 3-master cluster, ``repeats`` runs each, interleaved.

    Each row is the median over the runs, with the lowest and highest ops/s, so
    contention on a shared machine shows as spread instead of as a result.
    """
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        single = stack.enter_context(RedisServer())
        targets = [(single.url, "redis")]
        if cluster:
            nodes = stack.enter_context(RedisClusterServers())
            targets.append((nodes.url, "cluster"))
        shares: list[float] = []
        for _ in range(repeats):
            for url, backend in targets:
                before = _master_commands(nodes) if backend == "cluster" else []
                for row in await redis_ops(n, url, backend):
                    runs.setdefault((backend, row["op"]), []).append(row)
                if backend == "cluster":
                    served = [a - b for a, b in zip(_master_commands(nodes), before, strict=True)]
                    shares.append(max(served) / max(1, sum(served)))
                await flush(url)
    rows = []
    for (backend, op), found in runs.items():
        rates = sorted(r["ops_per_s"] for r in found)
        rows.append({
            "backend": backend, "op": op, "ops": n, "repeats": len(found),
            "ops_per_s": statistics.median(rates), "ops_per_s_min": rates[0],
            "ops_per_s_max": rates[-1],
            "p50_us": statistics.median(r["p50_us"] for r in found),
            "p99_us": statistics.median(r["p99_us"] for r in found),
            "store_errors_total": sum(r["store_errors_total"] for r in found),
        })  # fmt: skip
    single_rates = {r["op"]: r["ops_per_s"] for r in rows if r["backend"] == "redis"}
    for row in rows:
        if row["backend"] == "cluster":
            row["busiest_master_share"] = statistics.median(shares)
            twin = row["op"].replace("gathered", "pipelined")
            if twin in single_rates:
                row["vs_single"] = row["ops_per_s"] / single_rates[twin]
    return rows


HOLDER_BLOCKS = 17
"""Checkpoint blocks a request shares (64 fine blocks at stride 4, and its last)."""
HOLDER_FLUSH = 30
"""Requests whose holder writes one flush carries (``store.batching``: about 30 at 3k/s)."""


async def redis_holders(n: int, url: str, bound: int | None) -> dict[str, Any]:
    """Prefix-holder writes of ``n`` requests (4 tenants in turn, ``HOLDER_BLOCKS`` new blocks
    each), coalesced ``HOLDER_FLUSH`` requests a round trip as ``set_holders_soon`` does, under
    a per-tenant ``bound`` (``None``: plain SETs). Redis's own time per block
    (``INFO commandstats``) and its memory per block held, with the client's rate."""
    await flush(url)
    store = RedisStore(url, socket_timeout=2.0, connect_timeout=2.0, prefix="bench:",
                       max_holders_per_scope=bound)  # fmt: skip
    client = store._redis
    await client.config_resetstat()
    before = (await client.info("memory"))["used_memory"]
    tenants = [f"{t:016x}" for t in range(4)]
    started = time.perf_counter()
    for low in range(0, n, HOLDER_FLUSH):
        batch = {}
        for r in range(low, min(n, low + HOLDER_FLUSH)):
            for b in range(HOLDER_BLOCKS):
                batch[r * HOLDER_BLOCKS + b] = (WORKERS[r % 16], 600_000, tenants[r % 4])
        await store._write_holders(batch)
    elapsed = time.perf_counter() - started
    stats = await client.info("commandstats")
    # A script's own time includes the commands it calls (which commandstats counts too).
    server_us = stats["cmdstat_set" if bound is None else "cmdstat_evalsha"]["usec"]
    held = len([k async for k in client.scan_iter("bench:pfx:*", count=10_000)])
    used = (await client.info("memory"))["used_memory"] - before
    errors = store.errors_total
    await store.close()
    return {"backend": "redis", "op": f"holders, bound {bound}", "requests": n,
            "requests_per_s": n / elapsed, "server_us_per_block": server_us / (n * HOLDER_BLOCKS),
            "blocks_held": held, "bytes_per_block_held": used / max(1, held),
            "store_errors_total": errors}  # fmt: skip


async def holder_ops(n: int, repeats: int) -> list[dict[str, Any]]:
    """``redis_holders`` unbounded, at the default bound and at a bound that evicts, each
    ``repeats`` times interleaved: the median of each measure."""
    bounds = (None, 500_000, n * HOLDER_BLOCKS // 40)
    runs: dict[int | None, list[dict[str, Any]]] = {b: [] for b in bounds}
    with RedisServer() as server:
        for _ in range(repeats):
            for bound in bounds:
                runs[bound].append(await redis_holders(n, server.url, bound))
    rows = []
    for found in runs.values():
        row = dict(found[0])
        for name in ("requests_per_s", "server_us_per_block", "bytes_per_block_held"):
            row[name] = statistics.median(r[name] for r in found)
        rows.append(row)
    return rows


def _master_commands(nodes: RedisClusterServers) -> list[int]:
    """Commands each master has processed so far (``INFO stats``), masters in node order."""
    counts = []
    for node in nodes.nodes:
        if node.running and nodes.info(node, "role").startswith("master"):
            stats = nodes.info(node, "info", "stats")
            line = next(x for x in stats.splitlines() if x.startswith("total_commands_processed"))
            counts.append(int(line.split(":")[1]))
    return counts


async def flush(url: str) -> None:
    """Empty a backend between runs so every run writes new keys."""
    store = RedisStore(url, socket_timeout=2.0, connect_timeout=2.0)
    client = store._redis
    if store.cluster:
        await client.flushall(target_nodes=client.PRIMARIES)
    else:
        await client.flushall()
    await store.close()


def render(
    console: Console,
    mem: dict[str, float],
    ops: list[dict[str, Any]],
    holders: list[dict[str, Any]] | None = None,
) -> None:
    """Print the results as two tables."""
    table = Table(title=f"MemoryStore footprint, {int(mem['sessions']):,} sessions")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row(
        "RSS growth", f"{mem['rss_mb']:.0f} MB ({mem['rss_bytes_per_session']:.0f} B/session)"
    )
    if "traced_mb" in mem:
        table.add_row(
            "tracemalloc live",
            f"{mem['traced_mb']:.0f} MB ({mem['traced_bytes_per_session']:.0f} B/session)",
        )
    table.add_row("fill (async set)", f"{mem['fill_s']:.1f} s ({mem['sets_per_s']:,.0f} sets/s)")
    table.add_row("counts() over all", f"{mem['counts_s'] * 1e3:.1f} ms")
    table.add_row("sessions_of(limit=100)", f"{mem['sessions_of_100_s'] * 1e3:.1f} ms")
    console.print(table)

    table = Table(title="Affinity store throughput (single client process; median of repeats)")
    for name in ("backend", "operation", "ops/s", "min–max", "vs one redis", "p50 µs", "p99 µs"):
        table.add_column(name, justify="left" if name in ("backend", "operation") else "right")
    if any(row.get("store_errors_total") for row in ops):
        console.print("[red]redis calls failed during the run: some ops hit the fallback[/red]")
    for row in ops:
        spread = (
            f"{row['ops_per_s_min']:,.0f}–{row['ops_per_s_max']:,.0f}"
            if "ops_per_s_min" in row
            else ""
        )
        ratio = f"{row['vs_single']:.2f}×" if "vs_single" in row else ""
        table.add_row(row["backend"], row["op"], f"{row['ops_per_s']:,.0f}", spread, ratio,
                      f"{row['p50_us']:,.1f}", f"{row['p99_us']:,.1f}")  # fmt: skip
    console.print(table)
    share = next((r["busiest_master_share"] for r in ops if "busiest_master_share" in r), None)
    if share is not None:
        console.print(f"cluster: the busiest master served {share:.2f} of the commands")
    render_holders(console, holders or [])


def render_holders(console: Console, holders: list[dict[str, Any]]) -> None:
    """One line per bound of the prefix-holder writes."""
    for row in holders:
        console.print(
            f"{row['op']}: {row['requests_per_s']:,.0f} requests/s, "
            f"redis {row['server_us_per_block']:.2f} µs/block, {row['blocks_held']:,} held, "
            f"{row['bytes_per_block_held']:.0f} B/block held"
        )


async def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run every measurement and return the results."""
    redis = not args.no_redis and find_redis_server() is not None
    holders = await holder_ops(args.holders, args.repeats) if redis and args.holders else []
    if args.only_holders:
        return {"holders": holders}
    mem = await footprint(args.sessions, not args.no_tracemalloc)
    ops = await memory_ops(args.ops)
    if redis:
        ops += await backend_ops(args.redis_ops, args.repeats, cluster=not args.no_cluster)
    return {"footprint": mem, "ops": ops, "holders": holders}


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--ops", type=int, default=50_000, help="operations per memory test")
    parser.add_argument("--redis-ops", type=int, default=10_000, help="operations per redis test")
    parser.add_argument("--no-redis", action="store_true", help="skip the redis measurements")
    parser.add_argument("--no-cluster", action="store_true", help="skip the Redis Cluster")
    parser.add_argument(
        "--holders",
        type=int,
        default=3000,
        help="requests whose prefix-holder writes are measured (0: none)",
    )
    parser.add_argument("--only-holders", action="store_true",
                        help="measure the prefix-holder writes alone")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="runs per redis backend")
    parser.add_argument("--no-tracemalloc", action="store_true", help="RSS only (faster)")
    parser.add_argument("--asyncio", action="store_true", help="plain asyncio, not uvloop")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args()


if __name__ == "__main__":
    options = parse_args()
    if options.asyncio:
        results = asyncio.run(main(options))
    else:
        import uvloop  # the gateway's event loop

        results = uvloop.run(main(options))
    if "footprint" in results:
        render(Console(), results["footprint"], results["ops"], results["holders"])
    else:
        render_holders(Console(), results["holders"])
    if options.json:
        options.json.write_text(json.dumps(results, indent=2))
