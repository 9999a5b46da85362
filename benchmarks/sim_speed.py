"""Simulator speed: simulated requests per minute of CPU time, 16 workers, chat workload.

    .venv/bin/python benchmarks/sim_speed.py [--workers 16] [--requests 5000]
                                             [--rate 80] [--policies a,b] [--json PATH]

Each registered policy (or the ones named) runs the same multi-turn chat workload
(default options; ``--rate`` requests/s across the fleet) on a fresh fleet of H100
Llama-3-8B engines, one core. Speed is per CPU second of this process
(``time.process_time``) so other load on a shared machine does not distort it;
wall seconds are shown beside. Target: >= 100,000 simulated requests per minute.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvgate.core.policies import default_registry
from kvgate.sim.simulation import SimConfig, Simulation
from kvgate.workload.synthetic import build_workload

TARGET_PER_MIN = 100_000


@dataclass(frozen=True)
class Measurement:
    """One policy's run: speed, and enough of the results to see the run was real."""

    policy: str
    workers: int
    requests: int
    cpu_s: float
    wall_s: float
    requests_per_cpu_min: float
    requests_per_wall_min: float
    engine_steps: int
    simulated_s: float
    hit_rate: float
    ttft_p99_s: float
    meets_target: bool


def measure(policy: str, workers: int, requests: int, rate: float, seed: int) -> Measurement:
    """Run one policy once and time it."""
    workload = build_workload("chat", seed, overrides={"rate": rate})
    config = SimConfig(workers=workers, max_requests=requests, seed=seed)
    sim = Simulation(config, workload.requests(), policy)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    summary = sim.run().summary
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    steps = sim.step_calls
    per_min = requests / cpu * 60
    return Measurement(
        policy=policy,
        workers=workers,
        requests=summary["requests"],
        cpu_s=round(cpu, 3),
        wall_s=round(wall, 3),
        requests_per_cpu_min=round(per_min),
        requests_per_wall_min=round(requests / wall * 60),
        engine_steps=steps,
        simulated_s=summary["duration_s"],
        hit_rate=summary["hit_rate"],
        ttft_p99_s=summary["ttft_p99"],
        meets_target=per_min >= TARGET_PER_MIN,
    )


def main() -> None:
    """Parse arguments, run every policy, print the table (and write JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=80.0, help="requests/s across the fleet")
    parser.add_argument("--policies", default=",".join(default_registry()))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write results to this file")
    args = parser.parse_args()

    results = [
        measure(name.strip(), args.workers, args.requests, args.rate, args.seed)
        for name in args.policies.split(",")
        if name.strip()
    ]
    table = Table(
        title=(
            f"kvgate sim speed: chat at {args.rate:g} req/s, {args.workers} workers, "
            f"{args.requests} requests per policy (target {TARGET_PER_MIN:,}/min)"
        ),
        title_justify="left",
    )
    for column in (
        "policy",
        "CPU s",
        "wall s",
        "req/CPU-min",
        "req/wall-min",
        "step calls",
        "sim s",
        "hit",
        "TTFT p99",
        "target",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for m in results:
        table.add_row(
            m.policy,
            f"{m.cpu_s:.2f}",
            f"{m.wall_s:.2f}",
            f"{m.requests_per_cpu_min:,.0f}",
            f"{m.requests_per_wall_min:,.0f}",
            f"{m.engine_steps:,}",
            f"{m.simulated_s:.0f}",
            f"{m.hit_rate:.1%}",
            f"{m.ttft_p99_s * 1000:.0f} ms",
            "ok" if m.meets_target else "MISS",
        )
    Console(width=160).print(table)
    if args.json is not None:
        args.json.write_text(json.dumps({"sim_speed": [asdict(m) for m in results]}, indent=2))


if __name__ == "__main__":
    main()
