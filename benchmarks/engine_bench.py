"""Engine-alone throughput: engine steps and requests per wall-clock second.

Rates are per CPU second of this process (``time.process_time``), so other load
on a shared machine does not distort them; wall seconds are reported beside them.

A realistic mix: 2k-token prompts whose first half is one of a few shared system
prompts, 128-token outputs, Poisson arrivals near the engine's capacity; block
sizes 16 (vLLM's default) and 512 (trace hash_ids). Each case is driven twice:
as the simulator does (``horizon`` = time to the next arrival, decode steps fused)
and as the live worker does (one scheduler iteration per call).

    .venv/bin/python benchmarks/engine_bench.py [--requests N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvgate.engine import Engine, EngineConfig, EngineRequest


@dataclass(frozen=True)
class Case:
    """One benchmark configuration."""

    name: str
    block_size: int
    fused: bool


@dataclass(frozen=True)
class Measurement:
    """What one case measured (wall seconds, and model seconds simulated)."""

    case: str
    block_size: int
    fused: bool
    requests: int
    step_calls: int
    model_steps: int
    cpu_s: float
    wall_s: float
    model_s: float
    requests_per_s: float
    step_calls_per_s: float
    model_steps_per_s: float
    hit_rate: float
    ttft_mean_s: float
    preemptions: int


def workload(n: int, rate: float, block_size: int, seed: int) -> list[tuple[float, EngineRequest]]:
    """Arrivals of 2k-token prompts, half of each a shared system prompt, 128 tokens out."""
    rng = random.Random(seed)
    prompt, shared, out = 2048, 1024, 128
    families = [[rng.getrandbits(63) for _ in range(shared // block_size)] for _ in range(8)]
    arrivals = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        unique = [rng.getrandbits(63) for _ in range((prompt - shared) // block_size)]
        hashes = families[rng.randrange(len(families))] + unique
        arrivals.append((t, EngineRequest(f"r{i}", hashes, prompt, out, session_id=f"s{i % 500}")))
    return arrivals


def measure(case: Case, n: int, rate: float, seed: int) -> Measurement:
    """Drive one engine through the workload and time it (hash generation excluded)."""
    arrivals = workload(n, rate, case.block_size, seed)
    engine = Engine(EngineConfig(profile="h100-llama3-8b", block_size=case.block_size))
    now = 0.0
    i = 0
    calls = steps = 0
    start = time.perf_counter()
    cpu_start = time.process_time()
    while i < len(arrivals) or engine.has_work():
        while i < len(arrivals) and arrivals[i][0] <= now:
            engine.submit(arrivals[i][1], arrivals[i][0])
            i += 1
        if not engine.has_work():
            now = arrivals[i][0]
            continue
        horizon = None
        if case.fused:
            horizon = arrivals[i][0] - now if i < len(arrivals) else 3600.0
        result = engine.step(now, horizon)
        calls += 1
        steps += result.steps
        now += result.duration
    cpu = time.process_time() - cpu_start
    wall = time.perf_counter() - start
    stats = engine.stats(now)
    return Measurement(
        case=case.name,
        block_size=case.block_size,
        fused=case.fused,
        requests=stats.requests_finished,
        step_calls=calls,
        model_steps=steps,
        cpu_s=cpu,
        wall_s=wall,
        model_s=now,
        requests_per_s=stats.requests_finished / cpu,
        step_calls_per_s=calls / cpu,
        model_steps_per_s=steps / cpu,
        hit_rate=stats.prefix_hit_rate,
        ttft_mean_s=stats.ttft.sum / max(stats.ttft.count, 1),
        preemptions=stats.preemptions,
    )


def main() -> None:
    """Run every case, print a table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=6.0, help="arrivals per model second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write results to this file")
    args = parser.parse_args()

    cases = [
        Case("sim bs=16", 16, True),
        Case("sim bs=512", 512, True),
        Case("live bs=16", 16, False),
        Case("live bs=512", 512, False),
    ]
    results = [measure(c, args.requests, args.rate, args.seed) for c in cases]

    table = Table(title=f"engine alone: {args.requests} requests, 2048 in / 128 out, H100 profile")
    for col in ("case", "req/s", "step calls/s", "model steps/s", "cpu s", "wall s",
                "model s", "hit rate", "mean TTFT s", "preempt"):  # fmt: skip
        table.add_column(col, justify="right")
    for m in results:
        table.add_row(
            m.case,
            f"{m.requests_per_s:,.0f}",
            f"{m.step_calls_per_s:,.0f}",
            f"{m.model_steps_per_s:,.0f}",
            f"{m.cpu_s:.2f}",
            f"{m.wall_s:.2f}",
            f"{m.model_s:.0f}",
            f"{m.hit_rate:.3f}",
            f"{m.ttft_mean_s:.3f}",
            str(m.preemptions),
        )
    Console(width=140).print(table)
    if args.json is not None:
        args.json.write_text(json.dumps({"engine_bench": [asdict(m) for m in results]}, indent=2))


if __name__ == "__main__":
    main()
