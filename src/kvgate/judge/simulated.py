"""A scenario in the simulator: ``default`` and the peers' modelled rules on the same seed.

The peers are modelled by ``cache_aware`` (sglang-router's and smg's rule, which
vllm-router's ``cache_aware`` follows too) and HAProxy by ``round_robin``; both run as
a peer router runs (no memory-pressure handling, no KV gate:
``Experiment.as_peers``). Virtual time: contention on the machine cannot move a
figure, and a run is a pure function of the scenario, the router and the seed.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from typing import Any

from kvgate.judge.protocol import Routers, record
from kvgate.judge.scenarios import Scenario
from kvgate.sim.simulation import SimConfig, Simulation

SIM_ROUTERS = Routers("default", ("cache_aware",), "round_robin")
"""The simulator's line-up: kvgate's default, the peers' rule, round robin (HAProxy)."""


def sim_config(scenario: Scenario, seed: int, *, as_peer: bool) -> SimConfig:
    """The simulated fleet of ``scenario`` for ``seed`` (a peer has no pressure handling)."""
    slowdowns: tuple[tuple[float, int, float], ...] = ()
    if scenario.slowdown is not None:
        s = scenario.slowdown
        slowdowns = ((s.at_s, s.worker, s.speed),)
    config = SimConfig(
        workers=scenario.workers,
        profiles=scenario.profiles,
        kv_blocks=(scenario.kv_blocks,),
        block_size=scenario.block_size,
        seed=seed,
        max_requests=scenario.requests,
        client_concurrency=scenario.concurrency,
        slowdowns=slowdowns,
        cpu_offload_blocks=scenario.cpu_offload_blocks,
    )
    return dataclasses.replace(config, pressure=None) if as_peer else config


def run_simulated(
    scenario: Scenario, seed: int, routers: Routers = SIM_ROUTERS
) -> list[dict[str, Any]]:
    """Every router of ``routers`` on ``scenario`` with ``seed``: one record per router."""
    workload = scenario.source(seed)
    records = []
    for name in routers.all:
        role = routers.role(name)
        options = dict(routers.own_options) if role == "own" else {}
        config = sim_config(scenario, seed, as_peer=role != "own")
        result = Simulation(config, workload.requests(), name, options).run()
        summary = result.summary
        # Judged over every request: one refused is a miss and a TTFT that never came.
        counted = result.recorder.counting_unanswered()
        share = None
        if scenario.slowdown is not None:
            start = scenario.slowdown.at_s + scenario.slowdown.settle_s
            share = result.recorder.shares(start)[scenario.slowdown.worker]
        records.append(
            record(
                scenario,
                seed,
                name,
                role,
                mode="sim",
                **counted,  # hit_rate, ttft_p50/p99, ttft_return_p50/p99 (0 where none are)
                slowed_share=share,
                requests=summary["requests"],
                finished=summary["finished"],
                shed=summary["shed"],
                unanswered=result.recorder.unanswered,
                answered={k: summary[k] for k in ("hit_rate", "ttft_p50", "ttft_p99")},
            )
        )
    return records


def predicted(
    scenario: Scenario, seed: int, *, policy: str = "default", requests: int | None = None
) -> dict[str, Any]:
    """One simulated run of ``scenario`` with kvgate's ``policy`` on as many requests as its
    live run sends: each worker's TTFT prediction error (``Policy.speeds``: the median
    |predicted - observed| / observed of its last 256 requests, as ``/metrics`` shows it live),
    in the record ``kvgate.bench.prediction.measure`` makes of a live run. Virtual time: the
    machine's load cannot move it, and the live run's gateway, spreading a burst over the
    time it takes to route it, is not in it."""
    started = time.monotonic()
    count = requests or scenario.live_requests or scenario.requests
    config = dataclasses.replace(sim_config(scenario, seed, as_peer=False), max_requests=count)
    sim = Simulation(config, scenario.source(seed).requests(), policy)
    summary = sim.run().summary
    workers: dict[str, dict[str, float]] = {}
    for worker, r in sim.gateway.policy.speeds().items():
        row = {**dataclasses.asdict(r.speed), "observations": float(r.observations)}
        workers[worker] = row if r.ttft_error is None else {"error": r.ttft_error, **row}
    errors = [w["error"] for w in workers.values() if "error" in w]
    return {
        "scenario": scenario.name,
        "seed": seed,
        "policy": policy,
        "mode": "sim",
        "requests": summary["requests"],
        "errors": summary["shed"],
        "median_error": statistics.median(errors) if errors else None,
        "max_worker_error": max(errors) if errors else None,
        "workers": workers,
        "ttft_p50": summary["ttft_p50"],
        "client_over_model": None,
        "lost_model_share": 0.0,
        "load_average": os.getloadavg()[:2],
        "wall_s": round(time.monotonic() - started, 1),
    }


def run_all(
    scenarios: Sequence[Scenario],
    seeds: Sequence[int],
    routers: Routers = SIM_ROUTERS,
    *,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Every scenario on every seed, ``jobs`` runs at once (processes); records in order."""
    plan = [(s, seed) for s in scenarios for seed in seeds]
    out: list[dict[str, Any]] = []
    if jobs <= 1:
        for s, seed in plan:
            out += run_simulated(s, seed, routers)
            if progress is not None:
                progress(_line(out[-len(routers.all) :]))
        return out
    with ProcessPoolExecutor(jobs) as pool:
        for records in pool.map(run_simulated, *zip(*plan, strict=True), repeat(routers)):
            out += records
            if progress is not None:
                progress(_line(records))
    return out


def _line(records: Sequence[dict[str, Any]]) -> str:
    first = records[0]
    cells = ", ".join(
        f"{r['router']} {r['hit_rate']:.1%} "
        f"{r['ttft_p50'] * 1000:.0f}/{r['ttft_p99'] * 1000:.0f} ms"
        for r in records
    )
    return f"sim {first['scenario']} seed {first['seed']}: {cells}"
