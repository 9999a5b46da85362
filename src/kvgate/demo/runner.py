"""``run_demo``: every policy, in turn, behind the real gateway, on one cold fleet.

For each policy a fresh in-process gateway (its own store, so no affinity
carries over) is started in front of the fleet, whose prefix caches were reset,
and the same seeded workload is replayed through it with ``run_bench``. The
results are one ``results.json`` document with an entry per policy, as
``kvgate sim`` writes: nothing is adjusted, the table shows what was measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.bench import run_bench, workload_bound
from kvgate.bench.report import results_document
from kvgate.core.policies import default_registry, with_time_scale
from kvgate.demo.fleet import FleetFactory, FleetSpec, emulated_fleet
from kvgate.gateway.embedded import running_gateway
from kvgate.workload.prompts import CHARS_PER_TOKEN
from kvgate.workload.synthetic import build_workload

DEFAULT_POLICIES = (
    "round_robin",
    "least_request",
    "session_affinity",
    "prefix_affinity",
    "consistent_hash",
    "default",
)
"""Stateless baselines first, then the cache-aware policies."""

DEMO_WORKLOAD = "chat:rate=8,think_s=2,turns_mean=6,user_tokens=300,output_tokens=60"
"""Multi-turn chat behind one shared system prompt, in short sessions whose context
grows by a few hundred tokens a turn: more than one worker's KV cache holds at once,
less than the fleet's, so where a turn goes decides whether its context is cached."""

Progress = Callable[[str, int, int], None]
"""``progress(policy, done, total)`` after every answered request."""


@dataclass(frozen=True)
class DemoConfig:
    """Everything one demo run is made of; the defaults are the product's demo."""

    fleet: FleetSpec = field(default_factory=FleetSpec)
    policies: Sequence[str] = DEFAULT_POLICIES
    workload: str = DEMO_WORKLOAD
    requests: int = 240
    seed: int = 0
    concurrency: int = 256
    health_interval_s: float = 0.2
    chars_per_token: int = CHARS_PER_TOKEN
    """Characters of pseudo-text per workload token; the engine's tokenizer reads the
    simulator's pseudo-text at this ratio, so live prompts match the workload's counts."""

    def check(self) -> None:
        """Fail on an unknown policy or workload before anything starts."""
        if not self.policies:
            raise ValueError("give at least one policy")
        registry = default_registry()
        for name in self.policies:
            registry[name]
        build_workload(self.workload, self.seed)
        if self.requests < 1:
            raise ValueError("requests must be >= 1")


def gateway_config(config: DemoConfig, urls: Sequence[str], policy: str) -> dict[str, Any]:
    """The gateway's configuration for one policy in front of ``urls``."""
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "workers": [{"url": url, "model": config.fleet.model} for url in urls],
        "expose_worker_urls": True,  # answers are attributed to worker URLs
        "policy": {
            "name": policy,
            # The policy's model-time rates, on a fleet running faster than real time.
            "options": with_time_scale(default_registry(), policy, {}, config.fleet.time_scale),
        },
        "health": {"interval_s": config.health_interval_s, "timeout_s": 1.0},
        "seed": config.seed,
    }


async def run_demo(
    config: DemoConfig | None = None,
    *,
    fleet_factory: FleetFactory = emulated_fleet,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run every policy of ``config`` and return one results document.

    Latencies are in model seconds (wall seconds times the fleet's time scale).
    """
    config = config or DemoConfig()
    config.check()
    workload = build_workload(config.workload, config.seed)
    spec = config.fleet
    runs: dict[str, dict[str, Any]] = {}
    async with fleet_factory(spec) as fleet:
        urls = fleet.urls
        for policy in config.policies:
            await fleet.reset()
            async with running_gateway(gateway_config(config, urls, policy)) as gateway:
                tick = None
                if progress is not None:

                    def tick(done: int, total: int, name: str = policy) -> None:
                        progress(name, done, total)

                result = await run_bench(
                    gateway.url,
                    workload,
                    requests=config.requests,
                    concurrency=config.concurrency,
                    model=spec.model,
                    time_scale=spec.time_scale,
                    label=policy,
                    workers=urls,
                    block_size=spec.block_size,
                    chars_per_token=config.chars_per_token,
                    progress=tick,
                )
            runs[policy] = result["policies"][policy]
    bound = workload_bound(workload, config.requests, spec.block_size)
    fleet_json = {
        "kind": spec.kind,
        "workers": spec.workers,
        "profile": spec.profile,
        "time_scale": spec.time_scale,
        "kv_blocks": spec.kv_blocks,
        "block_size": spec.block_size,
        "worker_urls": urls,
    }
    demo_json = {
        "requests": config.requests,
        "seed": config.seed,
        "concurrency": config.concurrency,
        "fleet": fleet_json,
    }
    return results_document(runs, workload=workload.describe(), bound=bound, config=demo_json)
