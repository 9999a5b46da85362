"""Routing decision benchmark: ``pick`` time per policy, and prompt hashing time.

    .venv/bin/python benchmarks/decision_bench.py [--workers 64] [--sessions 100000]
                                                  [--picks 20000] [--seed 1] [--json PATH]

Decision time: 64 workers with random loads, 100k known sessions. Each session's
prompt is one of 64 shared 2 KiB system prompts plus a 1 KiB question of its
own; the stateful policies' prefix indexes are warmed with every session's
chain first, and each known session's affinity comes in through ``ctx`` as the
driver would pass it. Timed: ``pick`` alone (including the prefix-index
lookup), for requests of known sessions and of new sessions (a new question on
a known system prompt). Targets: p99 <= 100 µs. Beside it, the p99 of each pick's
least CPU time of three runs (``--best-of``): the kernel's timer tick, charged to
the call it interrupts, lands in 1 pick of 80 at 50 µs a pick, inside the p99,
and hides what the picks themselves cost at their slowest (the repeats run warm,
so that figure reads low by what cold caches cost: compare it between trees only).

Hashing time: ``build_features`` and the chain hashing alone on an 8 KiB chat
prompt (32 blocks of 256 characters), on a ~200 KiB long-context prompt (64
fine blocks, then 4 KiB coarse ones: 110 blocks) and on one of 200 K CJK
characters, and xxhash's streaming API over the same bytes for comparison.
Targets: ``build_features`` p99 well under 50 µs at 8 KiB and within the
decision-time budget (100 µs) on the long prompts; the prompt is hashed once
per request, before the decision.

Also timed: ``pick`` for headerless requests (a new question behind a known
system prompt, no session id), with the store's prefix holders in the context.
Memory: the prefix index's entries and RSS growth, per entry and per worker.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import random
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import xxhash
from rich.console import Console
from rich.table import Table

from kvgate.core.chain import block_widths, text_chain_hashes
from kvgate.core.decision import Affinity, Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import FleetSnapshot, WorkerState
from kvgate.core.policies import default_registry
from kvgate.core.policy import Policy, RouteContext
from kvgate.core.prefix import FeatureConfig, build_features

GROUPS = 64
P99_TARGET_US = 100.0
HASH_TARGET_US = {"8 KiB": 50.0, "200 KiB": 100.0, "200 K chars of CJK": 100.0}
"""``build_features`` p99 targets by prompt."""


def calibration_us(rounds: int = 2000) -> float:
    """Time of a fixed pure-Python loop (1,000 additions), to compare machines and load."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        total = 0
        for i in range(1000):
            total += i
        samples.append(time.perf_counter_ns() - start)
    return sorted(samples)[len(samples) // 2] / 1000


def load_average() -> float:
    """The 1-minute load average (other processes competing for the CPU)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def rss_bytes() -> int:
    """This process's resident set size, from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


CJK = "缓存前缀路由模型会话"
"""Characters for a non-ASCII prompt (hashed as UTF-16, slower than ASCII)."""


def words(rng: random.Random, chars: int, script: str = "") -> str:
    """Pseudo-text of about ``chars`` characters (of ``script``, if given, else ASCII)."""
    vocab = ["cache", "token", "prefix", "worker", "route", "model", "block", "session"]
    if script:
        vocab = [script[i : i + 2] for i in range(0, len(script), 2)]
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(vocab) + str(rng.randrange(1000))
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


def body(system: str, question: str) -> dict[str, Any]:
    """A chat completion request body."""
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    }


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile of already-sorted values (nearest rank)."""
    index = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return sorted_values[index]


def summarize(wall_ns: list[int], cpu_ns: list[int]) -> dict[str, float]:
    """p50, p99 and mean in microseconds, of wall-clock and of this thread's CPU time.

    On a shared machine the wall clock also counts time the process spent
    descheduled; the thread's CPU time is what the decision itself cost.
    """
    wall = sorted(s / 1000 for s in wall_ns)
    cpu = sorted(s / 1000 for s in cpu_ns)
    return {
        "p50_us": percentile(cpu, 0.50),
        "p99_us": percentile(cpu, 0.99),
        "mean_us": sum(cpu) / len(cpu),
        "wall_p50_us": percentile(wall, 0.50),
        "wall_p99_us": percentile(wall, 0.99),
    }


class Stopwatch:
    """Collects wall-clock and thread CPU time of repeated calls.

    With ``best_of`` > 1 each call is also run that many times over and its least CPU
    time kept apart (``best_p99_us``): the kernel's timer tick, every 4 ms here, is
    charged to whichever call it interrupts (1 call in 80 at 50 µs a call, evenly
    spaced), which puts it inside a p99 that then says little of the code timed.
    """

    def __init__(self, best_of: int = 1) -> None:
        self.best_of = best_of
        self.wall: list[int] = []
        self.cpu: list[int] = []
        self.best: list[int] = []

    def time(self, call: Callable[[], object]) -> object:
        """Run ``call`` (``best_of`` times), recording its times; returns its result."""
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        result = call()
        spent = time.thread_time_ns() - cpu
        self.cpu.append(spent)
        self.wall.append(time.perf_counter_ns() - wall)
        for _ in range(self.best_of - 1):
            cpu = time.thread_time_ns()
            call()
            spent = min(spent, time.thread_time_ns() - cpu)
        self.best.append(spent)
        return result

    def summary(self) -> dict[str, float]:
        """The percentiles of what was recorded."""
        stats = summarize(self.wall, self.cpu)
        if self.best_of > 1:
            stats["best_p99_us"] = percentile(sorted(s / 1000 for s in self.best), 0.99)
        return stats


def make_fleet(rng: random.Random, workers: int) -> FleetSnapshot:
    """``workers`` workers with random loads and KV usage."""
    return FleetSnapshot(
        0.0,
        tuple(
            WorkerState(
                id=f"http://10.0.{i // 16}.{i % 16}:8000",
                model="m",
                in_flight=rng.randrange(0, 24),
                waiting=rng.randrange(0, 4),
                kv_usage=rng.uniform(0.2, 0.8),
                kv_capacity_tokens=500_000,
            )
            for i in range(workers)
        ),
    )


def streamed_chain(data: bytes, widths: list[int]) -> list[int]:
    """The same cut, hashed with xxhash's streaming state (one update and digest a block)."""
    state = xxhash.xxh3_64()
    out: list[int] = []
    start = 0
    for width in widths:
        state.update(data[start : start + width])
        out.append(state.intdigest())
        start += width
    return out


def bench_hashing(rng: random.Random, rounds: int = 3000) -> dict[str, Any]:
    """Time feature extraction and chain hashing of 8 KiB and ~200 KiB prompts."""
    config = FeatureConfig()
    results: dict[str, Any] = {}
    headers = {"X-Session-ID": "sess-1", "X-Priority": "standard"}
    for label, size, script in (
        ("8 KiB", 8192, ""),
        ("200 KiB", 200 * 1024, ""),
        ("200 K chars of CJK", 200 * 1024, CJK),
    ):
        request_body = body(words(rng, 2048, script), words(rng, size - 2048, script))
        text = ((script or "x") * size)[:size]
        # The bytes the chain hashes: UTF-16-LE for other text than ASCII.
        data = text.encode("utf-16-le" if script else "ascii")
        unit = len(data) // size
        widths = [
            w * unit
            for w in block_widths(config.block_chars, config.max_blocks, config.coarse_factor, size)
        ]
        full, chain, streamed = Stopwatch(), Stopwatch(), Stopwatch()
        whole = partial(build_features, request_body, headers, config, request_id="r")
        only = partial(
            text_chain_hashes,
            text,
            config.block_chars,
            config.max_blocks,
            coarse_factor=config.coarse_factor,
            max_chars=config.max_chars,
        )
        stream = partial(streamed_chain, data, widths)
        for _ in range(rounds if size < 65536 else rounds // 3):
            full.time(whole)
            chain.time(only)
            streamed.time(stream)
        blocks = len(build_features(request_body, headers, config, request_id="r").prefix_hashes)
        results[label] = {
            "chars": size,
            "blocks": blocks,
            "build_features": full.summary(),
            "chain_only": chain.summary(),
            "xxhash_streaming": streamed.summary(),
        }
    return results


def bench_policies(
    rng: random.Random,
    n_workers: int,
    n_sessions: int,
    picks: int,
    n_chains: int = 0,
    *,
    best_of: int = 3,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Time ``pick`` for every registered policy on a warmed 100k-session fleet.

    ``n_chains`` headerless requests are routed too before timing (``default`` then
    looks for their chain ends on every headerless placement). Each pick is run
    ``best_of`` times over, its least CPU time kept too (``Stopwatch``).
    """
    config = FeatureConfig()
    systems = [words(rng, 2048) for _ in range(GROUPS)]
    snapshot = make_fleet(rng, n_workers)
    ids = [w.id for w in snapshot.workers]

    started = time.perf_counter()
    sessions: list[RequestFeatures] = []
    homes: list[str] = []
    for i in range(n_sessions):
        features = build_features(
            body(systems[i % GROUPS], words(rng, 1024)),
            {"X-Session-ID": f"sess-{i:08d}"},
            config,
            request_id=f"warm-{i}",
        )
        sessions.append(features)
        homes.append(ids[rng.randrange(n_workers)])
    for i in range(n_chains):
        features = build_features(
            body(systems[i % GROUPS], words(rng, 1024)), {}, config, request_id=f"chain-{i}"
        )
        sessions.append(features)
        homes.append(ids[rng.randrange(n_workers)])
    headerless = [
        build_features(body(systems[i % GROUPS], words(rng, 1024)), {}, config, request_id=f"h-{i}")
        for i in range(picks)
    ]
    newcomers = [
        build_features(
            body(systems[i % GROUPS], words(rng, 1024)),
            {"X-Session-ID": f"new-{i:08d}"},
            config,
            request_id=f"new-{i}",
        )
        for i in range(picks)
    ]
    setup_s = time.perf_counter() - started

    rows: list[dict[str, Any]] = []
    memory: dict[str, Any] = {"setup_s": setup_s}
    registry = default_registry()
    for name in registry:
        policy: Policy = registry.build(name)
        gc.collect()
        rss_before = rss_bytes()
        warm_started = time.perf_counter()
        # Only stateful policies learn from on_routed; the base hook is a no-op.
        for features, home in zip(sessions, homes, strict=True):
            policy.on_routed(features, home, 0.0)
        warm_s = time.perf_counter() - warm_started
        # A long-lived gateway's big, stable heap (sessions, index) is not what a
        # decision costs; freeze it so collector pauses do not land in the timings.
        gc.collect()
        gc.freeze()
        index = getattr(policy, "index", None)
        if index is not None:
            growth = rss_bytes() - rss_before
            per_worker = len(index) / max(1, len(list(index.workers())))
            memory[name] = {
                "entries": len(index),
                "distinct_blocks": index.distinct_blocks(),
                "rss_growth_mib": growth / 2**20,
                "bytes_per_entry": growth / max(1, len(index)),
                "entries_per_worker": per_worker,
                "mib_per_worker": growth / max(1, len(list(index.workers()))) / 2**20,
                "worker_capacity": index.capacity(ids[0]),
                "warm_s": warm_s,
            }
        for kind in ("known", "new", "headerless"):
            watch = Stopwatch(best_of)
            reasons: dict[str, int] = {}
            pick_rng = random.Random(7)
            for n in range(picks):
                holders: dict[str, int] = {}
                if kind == "known":
                    i = pick_rng.randrange(n_sessions)
                    request, home = sessions[i], homes[i]
                    affinity: Affinity | None = Affinity(request.session_key or "", home, "default")
                elif kind == "new":
                    request, affinity = newcomers[n], None
                else:
                    # The store's evidence: the system prompt's checkpoints name a worker.
                    request, affinity = headerless[n], None
                    holders = {ids[n % n_workers]: 8}
                context = RouteContext(snapshot, affinity, pick_rng, holders)
                decision = watch.time(partial(policy.pick, request, context))
                assert isinstance(decision, Decision)
                reasons[decision.reason] = reasons.get(decision.reason, 0) + 1
            top = max(reasons.items(), key=lambda item: item[1])
            rows.append(
                {
                    "policy": name,
                    "requests": kind,
                    **watch.summary(),
                    "top_reason": f"{top[0]} ({100 * top[1] / picks:.0f}%)",
                }
            )
        if name == "default":
            rows.append(
                _time_warm_ups(policy, snapshot, headerless, ids, picks=picks, best_of=best_of)
            )
        del policy, index
        gc.unfreeze()
    return rows, memory


def _time_warm_ups(
    policy: Policy,
    snapshot: FleetSnapshot,
    headerless: list[RequestFeatures],
    ids: list[str],
    *,
    picks: int,
    best_of: int,
) -> dict[str, Any]:
    """``warm_up`` after each headerless placement (routed first), on the fleet with one
    worker idle: what warm-ups add to a request's CPU when they can fire at all (with no
    worker idle it returns before placing anything again)."""
    idle = dataclasses.replace(snapshot.workers[0], in_flight=0, waiting=0)
    fleet = FleetSnapshot(snapshot.now, (idle, *snapshot.workers[1:]))
    watch = Stopwatch(best_of)
    pick_rng = random.Random(7)
    sent = 0
    for n in range(picks):
        request = headerless[n]
        context = RouteContext(fleet, None, pick_rng, {ids[n % len(ids)]: 8})
        worker = policy.pick(request, context).worker
        assert worker is not None
        policy.on_routed(request, worker, 0.0)
        warm = watch.time(partial(policy.warm_up, worker, context))
        sent += warm is not None
    return {
        "policy": "default",
        "requests": "warm_up (1 idle)",
        **watch.summary(),
        "top_reason": f"warm-up sent ({100 * sent / picks:.0f}%)",
    }


TIME_COLUMNS = ("what", "cpu p50 µs", "cpu p99 µs", "cpu mean µs", "wall p50 µs", "wall p99 µs")


def time_cells(stats: dict[str, Any]) -> list[str]:
    """The timing cells of one row."""
    keys = ("p50_us", "p99_us", "mean_us", "wall_p50_us", "wall_p99_us")
    return [f"{stats[key]:.1f}" for key in keys]


def main() -> None:
    """Run both benchmarks, print tables, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--picks", type=int, default=20_000)
    parser.add_argument(
        "--headerless-chains",
        type=int,
        default=0,
        help="also route this many headerless requests before timing",
    )
    parser.add_argument(
        "--best-of",
        type=int,
        default=3,
        help="run each pick this many times over; the target is judged on its least CPU time",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    console = Console(width=150)
    machine = {"calibration_us": calibration_us(), "load_average_start": load_average()}
    console.print(
        f"calibration: 1,000 Python additions take {machine['calibration_us']:.1f} µs "
        f"(about 20 µs on an idle modern core); load average {machine['load_average_start']}"
    )

    hashing = bench_hashing(rng)
    table = Table(title="Feature extraction and prefix hashing (whole prompt)")
    for column in ("prompt", *TIME_COLUMNS, "build_features p99 ≤ 50 µs (8 KiB), 100 µs"):
        table.add_column(column, justify="right")
    for label, result in hashing.items():
        for what in ("build_features", "chain_only", "xxhash_streaming"):
            stats = result[what]
            verdict = ""
            if what == "build_features" and label in HASH_TARGET_US:
                ok = stats["p99_us"] <= HASH_TARGET_US[label]
                verdict = "[green]ok[/]" if ok else "[red]over[/]"
            table.add_row(f"{label} ({result['blocks']} blocks)", what, *time_cells(stats), verdict)
    console.print(table)

    rows, memory = bench_policies(
        rng, args.workers, args.sessions, args.picks, args.headerless_chains, best_of=args.best_of
    )
    console.print(
        "cpu: this thread's CPU time per call; wall: including time descheduled; best: "
        f"p99 of the least CPU time of {args.best_of} runs of each pick (no timer tick; warm)"
    )
    table = Table(
        title=f"pick(), {args.workers} workers, {args.sessions:,} sessions warmed, "
        f"{args.picks:,} picks each"
    )
    table.add_column("policy")
    table.add_column("requests")
    for column in (*TIME_COLUMNS[1:], "best p99 µs", "p99 ≤ 100 µs"):
        table.add_column(column, justify="right")
    table.add_column("top reason")
    for row in rows:
        best = row.get("best_p99_us", row["p99_us"])
        ok = row["p99_us"] <= P99_TARGET_US
        table.add_row(
            row["policy"],
            row["requests"],
            *time_cells(row),
            f"{best:.1f}",
            "[green]ok[/]" if ok else "[red]over[/]",
            row["top_reason"],
        )
    console.print(table)
    console.print(f"load average at the end: {load_average()}")
    for name, stats in memory.items():
        if isinstance(stats, dict):
            console.print(
                f"{name}: prefix index {stats['entries']:,} entries "
                f"({stats['distinct_blocks']:,} distinct blocks), "
                f"RSS +{stats['rss_growth_mib']:.0f} MiB = {stats['bytes_per_entry']:.0f} B "
                f"an entry, {stats['mib_per_worker']:.2f} MiB a worker "
                f"({stats['entries_per_worker']:,.0f} entries; a worker's bound "
                f"{stats['worker_capacity']:,} blocks), warmed in {stats['warm_s']:.1f} s"
            )

    if args.json:
        results = {
            "config": vars(args) | {"json": str(args.json)},
            "hashing": hashing,
            "pick": rows,
            "index": memory,
            "machine": machine | {"load_average_end": load_average()},
        }
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
