"""A scenario live: each router in turn in front of a fresh emulated fleet, the real peers too.

The fleet is the scenario's (``kvgate.bench.fleet``: one ``kvgate worker-sim``
process per worker, its profile, its KV, time-scaled); the routers are
``kvgate.bench.routers``' (kvgate from this checkout, sglang-router and smg from
PyPI in their own virtualenvs). Figures are the workers' own: hit rate from
``cached_tokens``, TTFT on their model clock (contention on the machine cannot
inflate it, but a worker process that falls behind loses model time: reported as
``lost_model_share``), over every request: one refused or failed is a miss with an
unbounded TTFT (``bench.report.summarize``'s ``counting_unanswered``). A slowdown is
carried out as the simulator does it: at model second ``at_s`` of the replay the
worker is told its new speed (``POST /admin/faults``), and its share is its part of
the requests the fleet finished from ``settle_s`` later to the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from kvgate.bench import run_bench
from kvgate.bench.fleet import (
    FleetSpec,
    emulated_fleet,
    router_in_front,
    set_speed,
    worker_counters,
)
from kvgate.bench.routers import MODEL, ROUTERS, Router, prepare
from kvgate.judge.protocol import Routers, record
from kvgate.judge.scenarios import Scenario

LIVE_ROUTERS = Routers("kvgate-default", ("sglang-router", "smg"), "kvgate-round_robin")
"""The live line-up: kvgate's default, the two cache_aware peers, kvgate's round robin."""


def fleet_spec(scenario: Scenario, seed: int) -> FleetSpec:
    """The scenario's emulated fleet for ``seed``."""
    profiles = tuple(scenario.profile_of(i) for i in range(scenario.workers))
    return FleetSpec(
        profiles,
        scenario.block_size,
        scenario.kv_blocks,
        scenario.time_scale,
        seed,
        cpu_offload_blocks=scenario.cpu_offload_blocks,
    )


@contextlib.asynccontextmanager
async def scenario_fleet(
    scenario: Scenario, seed: int, router: Router, venv: Path | None, logs: Path
) -> AsyncIterator[tuple[list[str], str]]:
    """The scenario's fresh emulated fleet for ``seed`` with ``router`` in front: the
    workers' URLs and the router's."""
    async with (
        emulated_fleet(fleet_spec(scenario, seed), logs) as urls,
        router_in_front(
            router,
            venv,
            urls,
            seed,
            logs,
            time_scale=scenario.time_scale,
            offload_tier=scenario.cpu_offload_blocks > 0,
        ) as (base, _),
    ):
        yield urls, base


async def _slow_then_count(scenario: Scenario, urls: Sequence[str]) -> list[int]:
    """Carry out the slowdown on the replay's clock; the finished counts ``settle_s`` later."""
    slowdown = scenario.slowdown
    assert slowdown is not None
    await asyncio.sleep(slowdown.at_s / scenario.time_scale)
    await set_speed(urls[slowdown.worker], slowdown.speed)
    await asyncio.sleep(slowdown.settle_s / scenario.time_scale)
    return [c[0] for c in await worker_counters(urls)]


async def run_live(
    scenario: Scenario, seed: int, router: Router, *, venv: Path | None, role: str, logs: Path
) -> dict[str, Any]:
    """One router on a fresh fleet, one scenario and seed: the run's record."""
    workload = scenario.source(seed)
    requests = scenario.live_requests or scenario.requests
    started = time.monotonic()
    async with scenario_fleet(scenario, seed, router, venv, logs) as (urls, base):
        ready = time.monotonic()
        before = await worker_counters(urls)
        marks = (
            asyncio.create_task(_slow_then_count(scenario, urls))
            if scenario.slowdown is not None
            else None
        )
        try:
            results = await run_bench(
                base,
                workload,
                requests=requests,
                concurrency=scenario.concurrency,
                model=MODEL,
                time_scale=scenario.time_scale,
                label=router.name,
                block_size=scenario.block_size,
                count_unanswered=True,
            )
        finally:
            done = marks is not None and marks.done() and marks.exception() is None
            if marks is not None and not done:
                marks.cancel()
        after = await worker_counters(urls)
        replayed = time.monotonic()
    share = None
    if marks is not None and done and scenario.slowdown is not None:
        since = [a[0] - m for a, m in zip(after, marks.result(), strict=True)]
        share = since[scenario.slowdown.worker] / sum(since) if sum(since) else None
    s = results["policies"][router.name]
    # Judged over every request: one refused or failed is a miss and a TTFT that never came.
    counted = s["counting_unanswered"]
    lost = max(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return record(
        scenario,
        seed,
        router.name,
        role,
        mode="live",
        hit_rate=counted["hit_rate"],
        ttft_p50=counted.get("ttft_p50"),
        ttft_p99=counted.get("ttft_p99"),
        # Turns back from a tool call, on the workers' model clock as the other TTFTs.
        ttft_return_p50=counted.get("ttft_return_p50"),
        ttft_return_p99=counted.get("ttft_return_p99"),
        slowed_share=share,
        requests=s["requests"],
        finished=s["finished"],
        errors=s["errors"] + s["shed"],
        unanswered=counted["unanswered"],
        answered={
            "hit_rate": s["hit_rate"],
            "ttft_p50": s.get("worker_ttft_p50"),
            "ttft_p99": s.get("worker_ttft_p99"),
        },
        per_worker=[a[0] - b[0] for a, b in zip(after, before, strict=True)],
        lost_model_share=round(lost / max(1e-9, (replayed - ready) * scenario.time_scale), 4),
        wall_s=round(time.monotonic() - started, 1),
    )


async def run_all_live(
    scenarios: Sequence[Scenario],
    seeds: Sequence[int],
    logs: Path,
    routers: Routers = LIVE_ROUTERS,
    progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every scenario, seed and router in turn; a router that cannot start is an error record.
    A simulator-only scenario (``Scenario.sim_only``: the held-out shapes) is left out."""
    scenarios = [s for s in scenarios if not s.sim_only]
    if not scenarios:
        return []
    venvs: dict[str, Path | None] = {}
    unavailable: dict[str, str] = {}
    for name in routers.all:
        try:
            venvs[name] = prepare(ROUTERS[name], progress)
        except RuntimeError as exc:
            unavailable[name] = str(exc)
    out: list[dict[str, Any]] = []
    for scenario in scenarios:
        for seed in seeds:
            for name in routers.all:
                role = routers.role(name)
                folder = logs / f"{scenario.name}-s{seed}-{name}"
                folder.mkdir(parents=True, exist_ok=True)
                try:
                    if name in unavailable:
                        raise RuntimeError(unavailable[name])
                    rec = await run_live(
                        scenario, seed, ROUTERS[name], venv=venvs[name], role=role, logs=folder
                    )
                except (RuntimeError, OSError, TimeoutError, aiohttp.ClientError) as exc:
                    rec = record(scenario, seed, name, role, mode="live", error=f"{exc}")
                out.append(rec)
                progress(_line(rec))
    return out


def _line(r: dict[str, Any]) -> str:
    where = f"live {r['scenario']} seed {r['seed']} {r['router']}"
    if "error" in r:
        return f"{where}: FAILED {r['error']}"
    p50, p99 = r.get("ttft_p50") or 0.0, r.get("ttft_p99") or 0.0
    share = f", slowed share {r['slowed_share']:.3f}" if r.get("slowed_share") else ""
    back = r.get("ttft_return_p50")
    if back is not None:
        share += f", returning {back * 1000:.0f}/{(r.get('ttft_return_p99') or 0) * 1000:.0f} ms"
    return (
        f"{where}: hit {r['hit_rate']:.1%}, TTFT {p50 * 1000:.0f}/{p99 * 1000:.0f} ms, "
        f"per worker {r['per_worker']}{share}, lost {r['lost_model_share']:.1%}, "
        f"{r['wall_s']:.0f} s"
    )
