"""The peers benchmark: kvgate beside sglang-router, smg, vllm-router and HAProxy.

Each router in turn is put in front of the same COLD fleet of 4 emulated workers
(``kvgate worker-sim`` subprocesses with the ``h100-llama3-8b`` profile,
time-scaled, restarted for every router so each starts with empty caches) and
``kvgate.bench.run_bench`` replays each workload shape through it with the same
seed. Reported per shape and router, over seeds and repeats (mean and min-max):
prefix-cache hit rate (the workers' own ``cached_tokens``), model-clock TTFT p50
and p99 (the workers' own ``usage.kvgate_timing``, which client and router CPU
contention cannot inflate), requests per worker (each worker's own
``vllm:request_success_total``, as the peers name no worker in their answers),
and errors; beside them the infinite-cache bound and the capacity-aware
reference (the fleet's KV used as one LRU cache), and the TTFT floor's p99: each
request's TTFT alone on an idle worker at the cache it got (the workers' own
latency model, ``Engine.alone_ttft``), what no placement can cut at those hits.

Peers are installed into throwaway virtualenvs on first use
(``kvgate.bench.routers``; the fleet and the router in front of it are
``kvgate.bench.fleet``); a router that cannot be installed or started is
reported with its error and the others go on.

    .venv/bin/python benchmarks/peers.py --json /tmp/peers.json          # ~20 min
    .venv/bin/python benchmarks/peers.py --quick                         # ~4 min
    .venv/bin/python benchmarks/peers.py --shapes shared-prefix-groups --routers kvgate-default,smg
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from kvgate.bench import run_bench
from kvgate.bench.fleet import (
    FleetSpec,
    emulated_fleet,
    router_in_front,
    worker_counters,
)
from kvgate.bench.routers import MODEL, ROUTERS, Router, prepare
from kvgate.engine import Engine
from kvgate.engine.config import EngineConfig
from kvgate.tables import causes_table
from kvgate.workload.synthetic import build_workload
from kvgate.workload.traces import open_trace

WORKERS = 4
PROFILE = "h100-llama3-8b"
BLOCK_SIZE = 16
ALONE_TTFT = Engine(EngineConfig(block_size=BLOCK_SIZE, profile=PROFILE)).alone_ttft
"""A request's TTFT alone on one of the emulated workers (the floor column): their model."""


@dataclass(frozen=True)
class Shape:
    """One workload shape as the benchmark runs it.

    ``kv_blocks`` is each worker's KV cache (blocks of ``BLOCK_SIZE`` tokens; 0 =
    what the GPU holds); ``time_scale`` the workers' model seconds per real second,
    chosen so a run takes seconds while the workers keep their model clock.
    """

    name: str
    workload: str
    requests: int
    quick_requests: int
    concurrency: int
    kv_blocks: int
    time_scale: float
    why: str
    by_name: bool = False
    """Run only when ``--shapes`` names it: a variant beyond issue 11's table."""
    trace: str | None = None
    """A public trace replayed instead of the synthetic ``workload``: its path under
    ``--traces`` (the same requests whatever the seed or ``--vary``)."""


SHAPES: dict[str, Shape] = {
    shape.name: shape
    for shape in (
        Shape(
            name="shared-opening-trace",
            workload="shared-opening-trace",
            requests=300,
            quick_requests=150,
            concurrency=64,
            kv_blocks=10_000,
            time_scale=15.0,
            why="Mooncake-shaped conversations behind one shared 512-token block, to "
            "/v1/completions; the fleet's KV holds about half of what the bound reuses",
        ),
        Shape(
            name="shared-prefix-groups",
            workload="shared-prefix-groups:rate=2000",
            requests=128,
            quick_requests=128,
            concurrency=32,
            kv_blocks=0,
            time_scale=4.0,
            why="SGLang's generated shared prefix, 16 groups x 8 prompts, 2,048-token system "
            "prompts, 128-token questions, all at once, 32 in flight",
        ),
        Shape(
            name="headerless-chat",
            workload="headerless-chat",
            requests=240,
            quick_requests=120,
            concurrency=64,
            kv_blocks=2_000,
            time_scale=12.0,
            why="multi-turn chat behind 4 shared 1,024-token system prompts, no session header",
        ),
        Shape(
            name="agent-preamble",
            workload="agent-preamble",
            requests=240,
            quick_requests=120,
            concurrency=64,
            kv_blocks=2_000,
            time_scale=10.0,
            why="agent loops behind one 4,096-token tool preamble, no session header",
        ),
        Shape(
            name="session-docs",
            workload="session-docs",
            requests=240,
            quick_requests=120,
            concurrency=32,
            kv_blocks=3_000,
            time_scale=15.0,
            why="X-Session-ID sessions with ~4k-token documents, 32 open at once",
        ),
        Shape(
            name="shared-prefix-groups-tight",
            workload="shared-prefix-groups:rate=2000",
            requests=128,
            quick_requests=128,
            concurrency=128,
            kv_blocks=1_000,
            time_scale=4.0,
            why="shared-prefix-groups all 128 in flight at once, on workers whose KV (16k "
            "tokens) holds a quarter of the 16 group prompts: the gateway's KV handling",
            by_name=True,
        ),
        Shape(
            name="agent-tools",
            workload="agent-tools",
            requests=500,
            quick_requests=240,
            concurrency=64,
            kv_blocks=900,
            time_scale=10.0,
            why="tool-calling agents (issue 49): one 4,096-token preamble, 10-40 turns, "
            "log-normal tool pauses, subagents naming their parent; each worker's KV holds "
            "about one agent's whole context",
            by_name=True,
        ),
        Shape(
            name="mooncake-trace",
            workload="mooncake",
            requests=600,
            quick_requests=300,
            concurrency=64,
            kv_blocks=0,
            time_scale=15.0,
            why="Mooncake's public synthetic trace (FAST'25), its first requests: 15k-token "
            "prompts on average that share 512-token blocks, no session ids, to /v1/completions",
            by_name=True,
            trace="mooncake/synthetic_trace.jsonl",
        ),
    )
}
"""The shapes of issue 11, in table order, then the variants run only when named."""

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
"""Where the public traces lie (``--traces``): ``../shared/traces`` beside the checkout."""


QUICK_ROUTERS = ("kvgate-default", "sglang-router", "smg")
"""``--quick``'s routers: kvgate's default against the two cache_aware peers issue 11 judges by."""


@dataclass(frozen=True)
class Plan:
    """What one benchmark invocation runs."""

    shapes: Sequence[Shape]
    routers: Sequence[Router]
    seeds: Sequence[int]
    repeats: int
    requests: int | None
    quick: bool


@contextlib.asynccontextmanager
async def fleet(shape: Shape, seed: int, logs: Path) -> AsyncIterator[list[str]]:
    """Fresh emulated workers (cold caches) for the block; their URLs."""
    spec = FleetSpec((PROFILE,) * WORKERS, BLOCK_SIZE, shape.kv_blocks, shape.time_scale, seed)
    async with emulated_fleet(spec, logs) as urls:
        yield urls


def worker_kv_blocks(shape: Shape) -> int:
    """Each worker's KV blocks: the shape's, or what the profile's GPU holds."""
    if shape.kv_blocks:
        return shape.kv_blocks
    return EngineConfig(block_size=BLOCK_SIZE, profile=PROFILE).num_gpu_blocks


async def one_run(
    shape: Shape, router: Router, *, venv: Path | None, seed: int, requests: int, logs: Path
) -> dict[str, Any]:
    """One router on a fresh fleet, one shape and seed: the run's record."""
    workload = open_trace(shape.trace) if shape.trace else build_workload(shape.workload, seed)
    started = time.monotonic()
    async with (
        fleet(shape, seed, logs) as urls,
        router_in_front(router, venv, urls, seed, logs, time_scale=shape.time_scale) as (
            base,
            listed,
        ),
    ):
        ready = time.monotonic()
        before = await worker_counters(urls)
        results = await run_bench(
            base,
            workload,
            requests=requests,
            concurrency=shape.concurrency,
            model=MODEL,
            time_scale=shape.time_scale,
            label=router.name,
            block_size=BLOCK_SIZE,
            fleet_kv_blocks=WORKERS * worker_kv_blocks(shape),
            ttft_floor=ALONE_TTFT,
            misses=True,
        )
        after = await worker_counters(urls)
        replayed = time.monotonic()
    s = results["policies"][router.name]
    return {
        "shape": shape.name,
        "router": router.name,
        "seed": seed,
        "requests": s["requests"],
        "finished": s["finished"],
        "errors": s["errors"],
        "error_kinds": s["error_kinds"],
        "shed": s["shed"],
        "missing_usage": s["missing_usage"],
        "hit_rate": s["hit_rate"],
        "worker_ttft_p50": s.get("worker_ttft_p50"),
        "worker_ttft_p99": s.get("worker_ttft_p99"),
        # The p99 of each request's TTFT alone on an idle worker at the cache it got.
        "ttft_floor_p99": s.get("ttft_floor_p99"),
        "client_ttft_p50": s["ttft_p50"],
        "client_ttft_p99": s["ttft_p99"],
        "per_worker": [a[0] - b[0] for a, b in zip(after, before, strict=True)],
        # Prompt tokens the fleet computed during the run (warm-ups and recomputes after
        # preemption included), and what the clients' answers account for (usage).
        "fleet_prefill_tokens": sum(a[2] - b[2] for a, b in zip(after, before, strict=True)),
        "client_prefill_tokens": s["prompt_tokens"] - s["cached_tokens"],
        # Points of prompt tokens missed, by cause (``kvgate.bench.misses``), or None.
        "misses": (s.get("misses") or {}).get("points"),
        # Per worker, over the run's model duration: the share of model time lost to
        # the machine (0 on a quiet one).
        "lost_model_share": round(
            max(a[1] - b[1] for a, b in zip(after, before, strict=True))
            / max(1e-9, (replayed - ready) * shape.time_scale),
            4,
        ),
        "bound": results["bound_hit_rate"],
        "reference": results["reference_hit_rate"],
        "models_listed": listed,
        "startup_s": round(ready - started, 1),
        "replay_s": round(replayed - ready, 1),
        "wall_s": round(time.monotonic() - started, 1),
    }


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 6),
        "min": round(min(values), 6),
        "max": round(max(values), 6),
    }


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per shape and router: mean and min-max of every figure over seeds and repeats.

    Runs that failed (``error`` set) are counted apart; bound and reference are
    per shape (they depend only on the workload and seed).
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run in runs:
        out.setdefault(run["shape"], {}).setdefault(run["router"], {"_runs": []})
        out[run["shape"]][run["router"]]["_runs"].append(run)
    for routers in out.values():
        for name, entry in list(routers.items()):
            group = entry.pop("_runs")
            good = [r for r in group if "error" not in r]
            summary: dict[str, Any] = {
                "runs": len(good),
                "failed": [r["error"] for r in group if "error" in r],
            }
            if good:
                keys = ("hit_rate", "worker_ttft_p50", "worker_ttft_p99", "ttft_floor_p99",
                        "bound", "fleet_prefill_tokens")  # fmt: skip
                for key in keys:
                    values = [r[key] for r in good if r.get(key) is not None]
                    summary[key] = _spread(values) if values else None
                references = [r["reference"] for r in good if r.get("reference") is not None]
                summary["reference"] = _spread(references) if references else None
                per_worker = [sorted(r["per_worker"], reverse=True) for r in good]
                summary["per_worker"] = [
                    round(statistics.fmean(col), 1) for col in zip(*per_worker, strict=True)
                ]
                summary["errors"] = sum(r["errors"] + r["shed"] for r in good)
                summary["shed"] = sum(r["shed"] for r in good)
                summary["lost_model_share"] = max(r.get("lost_model_share", 0.0) for r in good)
                summary["requests"] = sum(r["requests"] for r in good)
                split = [r["misses"] for r in good if r.get("misses")]
                summary["misses"] = (
                    {
                        cause: round(statistics.fmean(m[cause] for m in split), 2)
                        for cause in split[0]
                    }
                    if split
                    else None
                )
            routers[name] = summary
    return out


TARGET_ROUTER = "kvgate-default"
TARGET_PEERS = ("sglang-router", "smg")
"""Issue 11's comparison: kvgate's ``default`` against the peers' cache_aware policies."""
HIT_TIE = 0.005
"""Hit rates within half a point count as a tie."""
OF_REFERENCE = 0.95
"""The least share of the capacity-aware reference a hit rate must reach."""
OVERLOADED_P99_S = 1.0
"""A shape whose better peer's p99 is at least this is overloaded (TTFT in seconds)..."""
OVERLOADED_FACTOR = 0.8
"""...and there kvgate's p99 must be at most this times the better peer's."""


def targets(
    summary: Mapping[str, Mapping[str, Mapping[str, Any]]],
    router: str = TARGET_ROUTER,
    against: Sequence[str] = TARGET_PEERS,
) -> list[dict[str, Any]]:
    """Per shape, ``router`` against the best of ``against`` on issue 11's targets.

    Means over the runs: hit rate at least the best peer's (less ``HIT_TIE``) and
    ``OF_REFERENCE`` of the capacity-aware reference; p99 at most the better peer's,
    ``OVERLOADED_FACTOR`` of it where that is ``OVERLOADED_P99_S`` or more. Requests
    refused (429) are counted beside: a hit rate is over the requests answered; so is
    the prompt tokens the fleet computed against the best peer's (warm-ups are prefill
    no client asked for, and a hit rate over the clients' requests leaves them out).
    Shapes where ``router`` or every one of ``against`` lacks a hit rate or a p99
    (failed runs, no usage) are left out.
    """
    rows: list[dict[str, Any]] = []
    for shape, routers in summary.items():
        measured = {
            n: r for n, r in routers.items() if r.get("hit_rate") and r.get("worker_ttft_p99")
        }
        own = measured.get(router)
        peers = {n: measured[n] for n in against if n in measured}
        if own is None or not peers:
            continue
        hit = own["hit_rate"]["mean"]
        best = max(peers, key=lambda n: peers[n]["hit_rate"]["mean"])
        best_hit = peers[best]["hit_rate"]["mean"]
        p99 = own["worker_ttft_p99"]["mean"]
        quick = min(peers, key=lambda n: peers[n]["worker_ttft_p99"]["mean"])
        quick_p99 = peers[quick]["worker_ttft_p99"]["mean"]
        factor = OVERLOADED_FACTOR if quick_p99 >= OVERLOADED_P99_S else 1.0
        reference = (own.get("reference") or {}).get("mean")
        own_prefill = (own.get("fleet_prefill_tokens") or {}).get("mean")
        peer_prefill = (peers[best].get("fleet_prefill_tokens") or {}).get("mean")
        prefill_ratio = own_prefill / peer_prefill if own_prefill and peer_prefill else None
        rows.append(
            {
                "shape": shape,
                "hit": hit,
                "best_peer": best,
                "best_peer_hit": best_hit,
                "hit_met": hit >= best_hit - HIT_TIE,
                "of_reference": hit / reference if reference else None,
                "reference_met": reference is None or hit >= OF_REFERENCE * reference,
                "p99": p99,
                "quick_peer": quick,
                "quick_peer_p99": quick_p99,
                "p99_factor": factor,
                "p99_met": p99 <= factor * quick_p99,
                "shed": own.get("shed", 0),
                "peers_shed": {n: peers[n].get("shed", 0) for n in peers},
                "requests": own["requests"],
                # The fleet's computed prompt tokens (warm-ups included) over the best peer's.
                "prefill_ratio": prefill_ratio,
            }
        )
    return rows


def _mark(met: bool) -> str:
    return "yes" if met else "NO"


def _target_cells(row: Mapping[str, Any]) -> list[str]:
    of_ref = row["of_reference"]
    factor = f"{row['p99_factor']:g}x " if row["p99_factor"] != 1.0 else ""
    refused = ", ".join(f"{n} {c}" for n, c in row["peers_shed"].items())
    return [
        row["shape"],
        f"{row['hit']:.1%} / {row['best_peer_hit']:.1%} ({row['best_peer']})",
        _mark(row["hit_met"]),
        f"{of_ref:.0%}" if of_ref is not None else "-",
        _mark(row["reference_met"]),
        f"{_secs_one(row['p99'])} / {factor}{_secs_one(row['quick_peer_p99'])}"
        f" ({row['quick_peer']}, {row['p99'] / (row['quick_peer_p99'] or 1e-9):.2f}x)",
        _mark(row["p99_met"]),
        f"{row['shed']}/{row['requests']} ({refused})",
        f"{ratio:.2f}x" if (ratio := row.get("prefill_ratio")) else "-",
    ]


TARGET_COLUMNS = ("shape", "hit / best peer", "hit", "/ref", ">=95%", "p99 / better peer",
                  "p99", "shed (peers)", "prefill / best peer")  # fmt: skip


def targets_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """The targets as one table, a row per shape."""
    table = Table(title=f"{TARGET_ROUTER} against the cache_aware peers", title_justify="left")
    for column in TARGET_COLUMNS:
        table.add_column(column, justify="left" if column == "shape" else "right")
    for row in rows:
        table.add_row(*_target_cells(row))
    return table


def targets_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The targets as a Markdown table."""
    lines = ["| " + " | ".join(TARGET_COLUMNS) + " |", "|---" * len(TARGET_COLUMNS) + "|"]
    lines += ["| " + " | ".join(_target_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _tokens(spread: Mapping[str, float] | None) -> str:
    """A mean token count in thousands (``-``: not measured)."""
    return "-" if spread is None else f"{spread['mean'] / 1000:.0f}k"


def _secs_one(value: float) -> str:
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def _pct(spread: Mapping[str, float] | None) -> str:
    if spread is None:
        return "-"
    text = f"{spread['mean']:.1%}"
    if spread["max"] - spread["min"] >= 0.0005:
        text += f" ({spread['min']:.1%}-{spread['max']:.1%})"
    return text


def _secs(spread: Mapping[str, float] | None) -> str:
    if spread is None:
        return "-"

    text = _secs_one(spread["mean"])
    if spread["max"] > spread["min"]:
        text += f" ({_secs_one(spread['min'])}-{_secs_one(spread['max'])})"
    return text


def shape_table(shape: str, routers: Mapping[str, Mapping[str, Any]]) -> Table:
    """One table for one shape: a row per router, with bound and reference in the title."""
    first = next((r for r in routers.values() if r.get("bound")), None)
    bound = first["bound"]["mean"] if first else None
    reference = first.get("reference") if first else None
    title = f"{shape}: infinite-cache bound {bound:.1%}" if bound is not None else shape
    if reference is not None:
        title += f", fleet-KV LRU reference {reference['mean']:.1%}"
    table = Table(title=title, title_justify="left")
    columns = (
        "router",
        "runs",
        "hit",
        "/ref",
        "TTFT p50",
        "TTFT p99",
        "floor p99",
        "per worker",
        "prefill",
        "errors",
        "lost",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "router" else "right")
    for name, s in routers.items():
        if not s["runs"]:
            table.add_row(name, "0", "failed: " + "; ".join(s["failed"])[:80], *("-",) * 8)
            continue
        hit = s["hit_rate"]
        ref = s.get("reference")
        of_ref = f"{hit['mean'] / ref['mean']:.0%}" if ref and ref["mean"] else "-"
        table.add_row(
            name,
            str(s["runs"]) + (f" (+{len(s['failed'])} failed)" if s["failed"] else ""),
            _pct(hit),
            of_ref,
            _secs(s.get("worker_ttft_p50")),
            _secs(s.get("worker_ttft_p99")),
            _secs(s.get("ttft_floor_p99")),
            "/".join(f"{v:.0f}" for v in s["per_worker"]),
            _tokens(s.get("fleet_prefill_tokens")),
            f"{s['errors']}/{s['requests']}",
            f"{s['lost_model_share']:.0%}",
        )
    return table


def misses_table(summary: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Table | None:
    """Per shape and router, the mean points of prompt tokens missed by cause (hit +
    causes = 100; ``moved`` is an upper bound live: no one reads a worker's cache)."""
    rows = [
        (f"{shape} {name}", {"hit_rate": s["hit_rate"]["mean"], "misses": {"points": s["misses"]}})
        for shape, routers in summary.items()
        for name, s in routers.items()
        if s.get("misses")
    ]
    return causes_table(rows, live=True, label="shape, router")


def markdown(summary: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """The summary as Markdown tables (for docs/benchmarks.md)."""
    lines = []
    for shape, routers in summary.items():
        first = next((r for r in routers.values() if r.get("bound")), None)
        head = f"**{shape}**"
        if first:
            head += f": bound {first['bound']['mean']:.1%}"
            if first.get("reference"):
                head += f", fleet-KV LRU reference {first['reference']['mean']:.1%}"
        lines += [
            head,
            "",
            "| router | hit | /ref | TTFT p50 | TTFT p99 | floor p99 | per worker | prefill"
            " | errors | lost |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, s in routers.items():
            if not s["runs"]:
                lines.append(f"| {name} | failed: {'; '.join(s['failed'])} | | | | | | | | |")
                continue
            ref = s.get("reference")
            of_ref = f"{s['hit_rate']['mean'] / ref['mean']:.0%}" if ref and ref["mean"] else "-"
            per_worker = "/".join(f"{v:.0f}" for v in s["per_worker"])
            lines.append(
                f"| {name} | {_pct(s['hit_rate'])} | {of_ref} | {_secs(s.get('worker_ttft_p50'))}"
                f" | {_secs(s.get('worker_ttft_p99'))} | {_secs(s.get('ttft_floor_p99'))}"
                f" | {per_worker} | {_tokens(s.get('fleet_prefill_tokens'))} |"
                f" {s['errors']}/{s['requests']} | {s['lost_model_share']:.0%} |"
            )
        lines.append("")
    return "\n".join(lines)


async def run(plan: Plan, logs: Path, console: Console) -> list[dict[str, Any]]:
    """Every shape, seed, repeat and router of ``plan``; one record per run."""
    venvs: dict[str, Path | None] = {}
    unavailable: dict[str, str] = {}
    for router in plan.routers:
        try:
            venvs[router.name] = prepare(router, console.print)
        except RuntimeError as exc:
            unavailable[router.name] = str(exc)
            console.print(f"[red]{router.name} unavailable: {exc}[/red]")
    runs: list[dict[str, Any]] = []
    for shape in plan.shapes:
        requests = plan.requests or (shape.quick_requests if plan.quick else shape.requests)
        for seed in plan.seeds:
            for repeat in range(plan.repeats):
                for router in plan.routers:
                    record: dict[str, Any]
                    if router.name in unavailable:
                        record = {"error": unavailable[router.name]}
                    else:
                        folder = logs / f"{shape.name}-s{seed}-r{repeat}-{router.name}"
                        folder.mkdir(parents=True, exist_ok=True)
                        try:
                            record = await one_run(
                                shape,
                                router,
                                venv=venvs[router.name],
                                seed=seed,
                                requests=requests,
                                logs=folder,
                            )
                        except (RuntimeError, OSError, TimeoutError, aiohttp.ClientError) as exc:
                            record = {"error": f"{type(exc).__name__}: {exc}"}
                    record.update(
                        {"shape": shape.name, "router": router.name, "seed": seed,
                         "repeat": repeat}
                    )  # fmt: skip
                    runs.append(record)
                    console.print(_progress_line(record))
    return runs


def _progress_line(record: Mapping[str, Any]) -> str:
    where = f"{record['shape']} seed {record['seed']} {record['router']}"
    if "error" in record:
        return f"{where}: FAILED {record['error']}"
    p99 = record.get("worker_ttft_p99")
    return (
        f"{where}: {record['finished']}/{record['requests']} done, "
        f"hit {record['hit_rate']:.1%} (ref {record['reference'] or 0:.1%}, "
        f"bound {record['bound']:.1%}), TTFT p99 "
        f"{p99 if p99 is not None else float('nan'):.2f}s, per worker {record['per_worker']}, "
        f"errors {record['errors']}, model time lost {record['lost_model_share']:.1%} "
        f"(start {record['startup_s']:.0f}s, replay "
        f"{record['replay_s']:.0f}s, all {record['wall_s']:.0f}s)"
    )


def varied(shape: Shape, vary: float) -> Shape:
    """``shape`` with ``vary=V`` added to its workload (``workload.synthetic``); traces as is."""
    if shape.trace:
        return shape
    sep = "," if ":" in shape.workload else ":"
    return replace(shape, workload=f"{shape.workload}{sep}vary={vary:g}")


def parse_plan(argv: Sequence[str] | None = None) -> tuple[Plan, argparse.Namespace]:
    """The plan from the command line (unknown shape or router names are errors)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--shapes",
        default=",".join(n for n, shape in SHAPES.items() if not shape.by_name),
        help="comma-separated shapes (default: all but those run only when named: "
        + ", ".join(n for n, shape in SHAPES.items() if shape.by_name)
        + ")",
    )
    parser.add_argument(
        "--routers",
        default=None,
        help=f"comma-separated routers (default: all; --quick: {','.join(QUICK_ROUTERS)})",
    )
    parser.add_argument("--seeds", default="0,1", help="comma-separated workload seeds")
    parser.add_argument(
        "--vary",
        type=float,
        default=0.0,
        help="jitter every shape's options left at their defaults by up to this fraction, "
        "drawn from the seed (the workloads' vary=V): shapes no one tuned on",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs per seed")
    parser.add_argument("--requests", type=int, default=None, help="requests per run (override)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one seed, fewer requests, kvgate default against the cache_aware peers (~5 min)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write every run and the summary")
    parser.add_argument("--logs", type=Path, default=None, help="keep the processes' logs here")
    parser.add_argument(
        "--traces", type=Path, default=TRACES, help="the public traces' folder (trace shapes)"
    )
    args = parser.parse_args(argv)

    def names(text: str, known: Mapping[str, object], what: str) -> list[str]:
        chosen = [n.strip() for n in text.split(",") if n.strip()]
        for name in chosen:
            if name not in known:
                parser.error(f"unknown {what} {name!r}; known: {', '.join(known)}")
        return chosen

    shapes = [SHAPES[n] for n in names(args.shapes, SHAPES, "shape")]
    for i, shape in enumerate(shapes):
        if shape.trace:
            path = args.traces / shape.trace
            if not path.is_file():
                parser.error(f"shape {shape.name}: no trace at {path} (--traces)")
            shapes[i] = replace(shape, trace=str(path))
    if args.vary < 0:
        parser.error("--vary must be >= 0")
    if args.vary:
        shapes = [varied(shape, args.vary) for shape in shapes]
    chosen = args.routers or ",".join(QUICK_ROUTERS if args.quick else ROUTERS)
    routers = [ROUTERS[n] for n in names(chosen, ROUTERS, "router")]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if args.quick and args.seeds == "0,1":
        seeds = seeds[:1]
    if args.repeats < 1 or (args.requests is not None and args.requests < 1) or not seeds:
        parser.error("--repeats and --requests must be >= 1, and --seeds not empty")
    return Plan(shapes, routers, seeds, args.repeats, args.requests, args.quick), args


def main(argv: Sequence[str] | None = None) -> None:
    """Run the plan, print one table per shape, write ``--json``."""
    plan, args = parse_plan(argv)
    console = Console() if Console().is_terminal else Console(width=160)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        logs = args.logs or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        logs.mkdir(parents=True, exist_ok=True)
        runs = asyncio.run(run(plan, logs, console))
    summary = summarize(runs)
    for shape, routers in summary.items():
        console.print(shape_table(shape, routers))
    split = misses_table(summary)
    if split is not None:
        console.print(split)
    verdicts = targets(summary)
    if verdicts:
        console.print(targets_table(verdicts))
    wall = time.monotonic() - started
    console.print(f"{len(runs)} runs in {wall / 60:.1f} min")
    if args.json is not None:
        document = {
            "plan": {
                "shapes": {s.name: replace(s).__dict__ for s in plan.shapes},
                "routers": [r.name for r in plan.routers],
                "seeds": list(plan.seeds),
                "repeats": plan.repeats,
                "requests": plan.requests,
                "quick": plan.quick,
                "workers": WORKERS,
                "profile": PROFILE,
                "block_size": BLOCK_SIZE,
            },
            "wall_s": round(wall, 1),
            "runs": runs,
            "summary": summary,
            "markdown": markdown(summary),
            "targets": verdicts,
            "targets_markdown": targets_markdown(verdicts),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
