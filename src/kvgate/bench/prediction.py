"""How well the gateway predicts each request's time to first token, live, per shape.

For a judged scenario (``kvgate.judge.scenarios``) and seed: a fresh emulated fleet
(``kvgate.bench.fleet``), kvgate in front of it as its own process with a policy that
learns each worker's speed (``core.speed``), the scenario's workload replayed; then the
gateway's own ``/metrics``: per worker, ``kvgate_worker_ttft_prediction_error_ratio`` (the
median |predicted - observed| / observed TTFT of its last 256 requests, each predicted
when it was sent, observed on the gateway's clock) and the learned speed. The machine's
load is read beside it: the gateway's clock is wall time, so a crowded machine shows up
in the error (``client_over_model``: the clients' TTFT p50 over the workers' own, model
clock; 1.0 on an idle machine).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvgate.bench import run_bench
from kvgate.bench.fleet import worker_counters
from kvgate.bench.routers import MODEL, kvgate_router
from kvgate.judge.live import scenario_fleet
from kvgate.judge.scenarios import Scenario

ERROR = "kvgate_worker_ttft_prediction_error_ratio"
LEARNED = {
    "overhead_s": "kvgate_worker_learned_overhead_seconds",
    "prefill_s": "kvgate_worker_learned_prefill_seconds_per_token",
    "decode_s": "kvgate_worker_learned_decode_seconds",
    "queue_s": "kvgate_worker_learned_queue_seconds",
    "observations": "kvgate_worker_speed_observations",
}


def per_worker(metrics_text: str) -> dict[str, dict[str, float]]:
    """Each worker's prediction error and learned speed, from a gateway's ``/metrics``."""
    names = {ERROR: "error", **{v: k for k, v in LEARNED.items()}}
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            key = names.get(sample.name)
            if key is not None:
                out.setdefault(sample.labels.get("worker", ""), {})[key] = sample.value
    return out


async def measure(
    scenario: Scenario,
    seed: int,
    logs: Path,
    *,
    policy: str = "default",
    requests: int | None = None,
) -> dict[str, Any]:
    """One live run of ``scenario`` with kvgate's ``policy``: its prediction error per worker."""
    router = kvgate_router(policy)
    count = requests or scenario.live_requests or scenario.requests
    started = time.monotonic()
    async with scenario_fleet(scenario, seed, router, None, logs) as (urls, base):
        ready = time.monotonic()
        before = await worker_counters(urls)
        results = await run_bench(
            base,
            scenario.source(seed),
            requests=count,
            concurrency=scenario.concurrency,
            model=MODEL,
            time_scale=scenario.time_scale,
            label=policy,
            block_size=scenario.block_size,
        )
        after = await worker_counters(urls)
        replayed = time.monotonic()
        async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as resp:
            workers = per_worker(await resp.text())
    s = results["policies"][policy]
    errors = [w["error"] for w in workers.values() if "error" in w]
    model_p50, client_p50 = s.get("worker_ttft_p50"), s.get("ttft_p50")
    lost = max(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return {
        "scenario": scenario.name,
        "seed": seed,
        "policy": policy,
        "requests": s["requests"],
        "errors": s["errors"] + s["shed"],
        "median_error": statistics.median(errors) if errors else None,
        "max_worker_error": max(errors) if errors else None,
        "workers": workers,
        "ttft_p50": model_p50,
        "client_over_model": client_p50 / model_p50 if client_p50 and model_p50 else None,
        "send_late_p90": s.get("send_late_p90"),
        "lost_model_share": round(lost / max(1e-9, (replayed - ready) * scenario.time_scale), 4),
        "load_average": os.getloadavg()[:2],
        "wall_s": round(time.monotonic() - started, 1),
    }


def summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per shape: the median over its runs of each run's median worker error, the worst
    worker seen, and the load the runs saw."""
    shapes: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        if run.get("median_error") is not None:
            shapes.setdefault(run["scenario"], []).append(run)
    return {
        name: {
            "runs": len(rs),
            "median_error": statistics.median(r["median_error"] for r in rs),
            "max_worker_error": max(r["max_worker_error"] for r in rs),
            "client_over_model": statistics.median(
                r["client_over_model"] for r in rs if r["client_over_model"] is not None
            )
            if any(r["client_over_model"] is not None for r in rs)
            else None,
            "load": max(r["load_average"][0] for r in rs),
        }
        for name, rs in shapes.items()
    }
