"""Per-request routing cost in the live gateway's router: features, snapshot and pick.

    .venv/bin/python benchmarks/route_bench.py [--workers 8,64] [--requests 20000]
                                               [--policies default,round_robin] [--json PATH]

Runs the gateway's own ``WorkerPool`` and ``Router`` (no sockets, no event loop:
``Router.place`` is driven to completion synchronously, which it reaches because
an in-memory store never suspends and no worker is full). Every worker has fresh
scraped signals; ``--concurrency`` requests stay in flight (each placement is
released that many requests later), so the in-flight counts change on every
request as they do in a loaded gateway, and one worker's signals are replaced
every ``--scrape-every`` requests (a scrape). With ``rollout`` the model is split
50/50 between versions v1 and v2 (half the workers each), so version assignment
and the per-version snapshot are included.

Timed per request (this thread's CPU time, and wall clock):

- ``snapshot``: ``pool.snapshot`` for the request's model (and version) alone;
- ``route``: the router's whole synchronous part: ``build_features`` from the
  parsed body and headers, the store lookup, and ``Router.place`` (snapshot,
  admission, pick, in-flight accounting, affinity write, ``on_routed``).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections import deque
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from multidict import CIMultiDict

from kvgate.core.admission import AdmissionConfig
from kvgate.core.policies import default_registry
from kvgate.core.prefix import FeatureConfig, build_features
from kvgate.core.route import RouteConfig
from kvgate.core.versions import ModelVersions, VersionWeights
from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.control.versions import VersionRegistry
from kvgate.gateway.dataplane.queue import AdmissionQueue
from kvgate.gateway.dataplane.router import Placement, Router
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.observe.scrape import WorkerSignals
from kvgate.gateway.routing import Routing
from kvgate.store import MemoryStore

T = TypeVar("T")
MONO = 1000.0
"""The benchmark's fixed monotonic time: every worker's signals stay fresh."""


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a coroutine that never suspends to its result."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("the coroutine suspended (a full worker or a store that awaits)")


def load_average() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def signals(rng: random.Random) -> WorkerSignals:
    """One scrape's worth of plausible signals."""
    return WorkerSignals(
        engine="vllm",
        running=rng.randrange(0, 16),
        waiting=rng.randrange(0, 4),
        kv_usage=rng.uniform(0.2, 0.8),
        kv_capacity_tokens=500_000,
        gpu_temp_c=60.0,
        gpu_mem_used_mib=60_000.0,
        gpu_mem_total_mib=80_000.0,
    )


def make_pool(n: int, rollout: bool, rng: random.Random) -> WorkerPool:
    """``n`` probed workers of model ``m`` with fresh signals (half v2 with ``rollout``)."""
    workers = []
    for i in range(n):
        version = "v2" if rollout and i % 2 else "v1"
        config = WorkerConfig(
            url=f"http://10.0.{i // 16}.{i % 16}:8000", model="m", version=version
        )
        worker = Worker(config, upstream=None)  # type: ignore[arg-type]  # never forwarded to
        worker.update(probe_ok=True, signals=signals(rng), signals_at=MONO)
        workers.append(worker)
    return WorkerPool(workers, stale_after=15.0, queue=AdmissionQueue(1024))


def body(rng: random.Random, systems: list[str], session: int) -> dict[str, Any]:
    """A chat body: one of a few shared system prompts and a question of its own."""
    question = " ".join(f"word{rng.randrange(1000)}" for _ in range(60))
    return {
        "model": "m",
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": systems[session % len(systems)]},
            {"role": "user", "content": question},
        ],
    }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of sorted ``values``."""
    return values[min(len(values) - 1, int(q * len(values)))]


def stats(ns: list[int]) -> dict[str, float]:
    """p50, p99 and mean in microseconds."""
    us = sorted(x / 1000 for x in ns)
    return {
        "p50_us": percentile(us, 0.5),
        "p99_us": percentile(us, 0.99),
        "mean_us": sum(us) / len(us),
    }


def bench(
    policy_name: str, n_workers: int, rollout: bool, requests: int, opts: argparse.Namespace
) -> dict[str, Any]:
    """Route ``requests`` requests through a fresh pool and router; their timings."""
    rng = random.Random(opts.seed)
    pool = make_pool(n_workers, rollout, rng)
    versions = None
    if rollout:
        versions = VersionRegistry(pool)
        versions.replace(ModelVersions("m", VersionWeights({"v1": 50, "v2": 50}), "v1"))
    store = MemoryStore(clock=lambda: MONO)
    router = Router(
        pool,
        Routing.of(default_registry().build(policy_name)),
        store,
        GatewayMetrics(),
        RouteConfig(AdmissionConfig()),
        affinity_ttl=600.0,
        rng=random.Random(opts.seed),
        wall=time.time,
        mono=lambda: MONO,
        versions=versions,
    )
    config = FeatureConfig()
    systems = [f"system prompt {g} " + "lorem ipsum " * 150 for g in range(16)]
    # Pre-built requests: the JSON is parsed before routing, as in the proxy.
    bodies = [body(rng, systems, i) for i in range(512)]
    headers = [
        CIMultiDict(
            {
                "Host": "gateway:8080",
                "User-Agent": "bench/1.0",
                "Accept": "*/*",
                "Content-Type": "application/json",
                "Authorization": "Bearer sk-xxxxxxxx",
                "X-Session-ID": f"session-{i % opts.sessions}",
            }
        )
        for i in range(512)
    ]
    in_flight: deque[Placement] = deque()
    route_cpu: list[int] = []
    route_wall: list[int] = []
    snap_cpu: list[int] = []
    reasons: dict[str, int] = {}
    ids = [w.id for w in pool]
    gc.collect()
    gc.freeze()
    for n in range(requests):
        if n % opts.scrape_every == 0:
            scraped = pool.get(ids[(n // opts.scrape_every) % len(ids)])
            assert scraped is not None
            scraped.update(signals=signals(rng), signals_at=MONO)
        payload, hdrs = bodies[n % len(bodies)], headers[n % len(headers)]
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        features = build_features(payload, hdrs, config, request_id=f"r{n}", endpoint="chat")
        affinity = run_sync(router.lookup(features))
        placement = run_sync(router.place(features, affinity))
        route_cpu.append(time.thread_time_ns() - cpu)
        route_wall.append(time.perf_counter_ns() - wall)
        reasons[placement.reason] = reasons.get(placement.reason, 0) + 1
        version = "v1" if n % 2 else "v2"
        cpu = time.thread_time_ns()
        _timed_snapshot(pool, version if rollout else None)
        snap_cpu.append(time.thread_time_ns() - cpu)
        in_flight.append(placement)
        if len(in_flight) > opts.concurrency:
            done = in_flight.popleft()
            done.lease.release()
    gc.unfreeze()
    top = max(reasons.items(), key=lambda item: item[1])
    return {
        "policy": policy_name,
        "workers": n_workers,
        "rollout": rollout,
        "route": stats(route_cpu),
        "route_wall": stats(route_wall),
        "snapshot": stats(snap_cpu),
        "top_reason": f"{top[0]} ({100 * top[1] / requests:.0f}%)",
    }


def _timed_snapshot(pool: WorkerPool, version: str | None) -> object:
    """The snapshot a request of ``version`` gets (only that version's workers)."""
    return pool.snapshot("m", time.time(), MONO, version)


def main() -> None:
    """Run every (policy, fleet size, rollout) combination and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="8,64")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--policies", default="default,round_robin")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--sessions", type=int, default=5_000)
    parser.add_argument("--scrape-every", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    opts = parser.parse_args()
    print(f"load average {load_average()}; cpu µs per request (this thread), wall in brackets")
    print(
        f"{'policy':<14}{'workers':>8}{'rollout':>9}{'snapshot p50/p99':>20}"
        f"{'route p50/p99':>18}{'route mean':>12}{'wall p50/p99':>18}  top reason"
    )
    rows = []
    for name in opts.policies.split(","):
        for n in (int(x) for x in opts.workers.split(",")):
            for rollout in (False, True):
                row = bench(name, n, rollout, opts.requests, opts)
                rows.append(row)
                s, r, w = row["snapshot"], row["route"], row["route_wall"]
                print(
                    f"{name:<14}{n:>8}{'yes' if rollout else 'no':>9}"
                    f"{s['p50_us']:>10.1f}/{s['p99_us']:<9.1f}"
                    f"{r['p50_us']:>9.1f}/{r['p99_us']:<8.1f}{r['mean_us']:>12.1f}"
                    f"{w['p50_us']:>9.1f}/{w['p99_us']:<8.1f}  {row['top_reason']}"
                )
    print(f"load average at the end {load_average()}")
    if opts.json is not None:
        meta = {"load_avg": load_average(), **vars(opts), "json": str(opts.json)}
        opts.json.write_text(json.dumps({"options": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
