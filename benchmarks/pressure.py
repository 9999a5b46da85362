"""Memory pressure live: the same chat load with pressure handling on and off, in one run.

Emulated workers (Llama-3-8B-on-H100 latency profile, a small KV cache, a CPU
offload tier, high time scale) sit behind an in-process gateway running
``session_affinity``: sessions (``X-Session-ID``) are bound to a worker and stay
there; new sessions go to the least loaded worker, by request count. Every
``--heavy-every``-th session is a long-document one (``--heavy-user-words`` per
turn instead of ``--user-words``), and sessions start in order, so counting
requests puts every heavy session on the same worker. Its conversations grow
turn by turn until the running requests' KV outgrows that worker's cache and
the engine preempts (recomputes) them, while the other workers have room.

Each mode gets fresh workers and a fresh gateway and the same seeded load:
``--sessions`` closed-loop chat sessions, started ``--stagger-ms`` apart, each
``--turns`` turns long with a think time between turns. Reported per mode:

- preemptions: the workers' own ``vllm:num_preemptions_total``, scraped at the end;
- failed requests: any answer that is not a complete 200 stream;
- TTFT p50/p99 (seconds, wall clock, client side);
- hit rate: cached_tokens / prompt_tokens summed over every answer's usage;
- time above the hard watermark: each worker's KV usage sampled every
  ``--sample-ms`` in process; total seconds and the longest stretch, against the
  gateway's scrape interval;
- the gateway's sessions moved, offload calls and 429s, and how many requests
  it held for KV headroom on their worker (``core.pressure.kv_fits``).

    .venv/bin/python benchmarks/pressure.py
    .venv/bin/python benchmarks/pressure.py --sessions 48 --turns 8 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from kvgate.bench.client import Answer, BenchClient
from kvgate.bench.payloads import Payload
from kvgate.gateway.observe.scrape import parse_worker_metrics
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import wait_until
from kvgate.workersim import WorkerOptions, running_worker
from kvgate.workersim.runner import WorkerHandle

HARD = 0.95


@dataclass
class Settings:
    """The load and the fleet, the same for both modes."""

    workers: int = 3
    kv_blocks: int = 1024
    cpu_offload_blocks: int = 4096
    time_scale: float = 4.0
    sessions: int = 30
    turns: int = 4
    stagger_ms: float = 40.0
    think_ms: float = 150.0
    system_words: int = 200
    user_words: int = 30
    heavy_every: int = 3
    heavy_user_words: int = 400
    policy: str = "session_affinity"
    max_tokens: int = 300
    scrape_ms: float = 50.0
    sample_ms: float = 5.0
    seed: int = 1


@dataclass
class KvTrace:
    """Per-worker KV usage sampled over the run: time above the hard mark."""

    above_s: dict[str, float] = field(default_factory=dict)
    longest_s: dict[str, float] = field(default_factory=dict)
    peak: dict[str, float] = field(default_factory=dict)


@dataclass
class ModeResult:
    """What one mode measured."""

    mode: str
    requests: int
    failed: int
    preemptions: int
    preemptions_by_worker: dict[str, int]
    ttft_p50_s: float
    ttft_p99_s: float
    hit_rate: float
    above_hard_total_s: float
    above_hard_longest_s: float
    kv_peak: float
    sessions_moved: float
    kv_holds: int
    offloads: float
    sheds: float
    requests_by_worker: dict[str, int]
    errors: list[str]
    wall_s: float


def _words(rng: random.Random, n: int, tag: str) -> str:
    return " ".join(f"{tag}{rng.randrange(100_000)}" for _ in range(n))


async def _session(
    client: BenchClient,
    settings: Settings,
    index: int,
    system: str,
    answers: list[Answer],
) -> None:
    rng = random.Random(settings.seed * 1_000 + index)
    heavy = settings.heavy_every > 0 and index % settings.heavy_every == 0
    user_words = settings.heavy_user_words if heavy else settings.user_words
    await asyncio.sleep(index * settings.stagger_ms / 1000)
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    for turn in range(settings.turns):
        messages.append({"role": "user", "content": _words(rng, user_words, f"s{index}u")})
        payload = Payload(
            path="/v1/chat/completions",
            body={
                "model": "demo",
                "messages": list(messages),
                "max_tokens": settings.max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            headers={"X-Session-ID": f"session-{index}"},
        )
        answer = await client.send(payload)
        answers.append(answer)
        if not answer.ok:
            return  # a failed turn ends the session: later turns would not be comparable
        messages.append({"role": "assistant", "content": answer.text})
        if turn + 1 < settings.turns:
            await asyncio.sleep(rng.uniform(0.5, 1.5) * settings.think_ms / 1000)


async def _sample(workers: list[WorkerHandle], every_s: float, trace: KvTrace) -> None:
    """Sample KV usage until cancelled; fold into total / longest time above hard."""
    since: dict[str, float | None] = {w.url: None for w in workers}
    last = time.monotonic()
    try:
        while True:
            await asyncio.sleep(every_s)
            now = time.monotonic()
            for w in workers:
                usage = w.engine.kv_usage
                trace.peak[w.url] = max(trace.peak.get(w.url, 0.0), usage)
                if usage >= HARD:
                    trace.above_s[w.url] = trace.above_s.get(w.url, 0.0) + (now - last)
                    if since[w.url] is None:
                        since[w.url] = last
                    start = since[w.url]
                    assert start is not None
                    trace.longest_s[w.url] = max(trace.longest_s.get(w.url, 0.0), now - start)
                else:
                    since[w.url] = None
            last = now
    except asyncio.CancelledError:
        return


@contextlib.asynccontextmanager
async def _fleet(settings: Settings) -> AsyncIterator[list[WorkerHandle]]:
    async with contextlib.AsyncExitStack() as stack:
        handles = []
        for i in range(settings.workers):
            options = WorkerOptions(
                port=0,
                seed=i,
                profile="h100-llama3-8b",
                kv_blocks=settings.kv_blocks,
                cpu_offload_blocks=settings.cpu_offload_blocks,
                time_scale=settings.time_scale,
            )
            handles.append(await stack.enter_async_context(running_worker(options)))
        yield handles


async def _preemptions(session: aiohttp.ClientSession, worker: WorkerHandle) -> int:
    async with session.get(f"{worker.url}/metrics") as resp:
        signals = parse_worker_metrics(await resp.text())
    return signals.preemptions_total or 0


def _gateway_total(gw: GatewayHandle, name: str) -> float:
    total = 0.0
    for line in gw.gateway.metrics.render().decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_mode(settings: Settings, pressure: bool) -> ModeResult:
    """One mode on a fresh fleet and gateway."""
    async with _fleet(settings) as fleet:
        config: dict[str, Any] = {
            "workers": [{"url": w.url} for w in fleet],
            "expose_worker_urls": True,  # answers are attributed to worker URLs
            "health": {"interval_s": settings.scrape_ms / 1000, "timeout_s": 1.0},
            "pressure": {"enabled": pressure},
            "policy": {"name": settings.policy},
        }
        async with running_gateway(config) as gw, aiohttp.ClientSession() as plain:
            await wait_until(gw.gateway.ready, message="gateway ready")
            system = _words(random.Random(settings.seed), settings.system_words, "sys")
            answers: list[Answer] = []
            trace = KvTrace()
            sampler = asyncio.create_task(_sample(fleet, settings.sample_ms / 1000, trace))
            started = time.monotonic()
            async with BenchClient(gw.url, concurrency=settings.sessions * 2) as client:
                await asyncio.gather(
                    *(
                        _session(client, settings, i, system, answers)
                        for i in range(settings.sessions)
                    )
                )
            wall = time.monotonic() - started
            sampler.cancel()
            await sampler
            await gw.gateway.pressure.idle()
            by_worker = {w.url: await _preemptions(plain, w) for w in fleet}
            moved = _gateway_total(gw, "kvgate_sessions_moved_total")
            offloads = _gateway_total(gw, "kvgate_offloads_total")
            sheds = _gateway_total(gw, "kvgate_shed_total")
            holds = gw.gateway.router.kv_holds
    ok = [a for a in answers if a.ok]
    ttfts = [a.first_token - a.sent for a in ok if a.first_token is not None]
    prompt = sum(a.prompt_tokens or 0 for a in ok)
    cached = sum(a.cached_tokens or 0 for a in ok)
    served: dict[str, int] = {}
    for a in ok:
        served[a.worker or "?"] = served.get(a.worker or "?", 0) + 1
    expected = settings.sessions * settings.turns
    failed = sum(1 for a in answers if not a.ok) + (expected - len(answers))
    return ModeResult(
        mode="pressure on" if pressure else "pressure off",
        requests=len(answers),
        failed=failed,
        preemptions=sum(by_worker.values()),
        preemptions_by_worker=by_worker,
        ttft_p50_s=statistics.median(ttfts) if ttfts else float("nan"),
        ttft_p99_s=_pct(ttfts, 0.99),
        hit_rate=cached / prompt if prompt else 0.0,
        above_hard_total_s=sum(trace.above_s.values()),
        above_hard_longest_s=max(trace.longest_s.values(), default=0.0),
        kv_peak=max(trace.peak.values(), default=0.0),
        sessions_moved=moved,
        kv_holds=holds,
        offloads=offloads,
        sheds=sheds,
        requests_by_worker=served,
        errors=sorted({a.error or "" for a in answers if not a.ok})[:5],
        wall_s=wall,
    )


def _table(results: list[ModeResult], settings: Settings) -> str:
    off, on = results
    rows: list[tuple[str, Callable[[ModeResult], str]]] = [
        ("requests (failed)", lambda r: f"{r.requests} ({r.failed})"),
        ("preemptions", lambda r: str(r.preemptions)),
        ("TTFT p50 / p99 (s)", lambda r: f"{r.ttft_p50_s:.3f} / {r.ttft_p99_s:.3f}"),
        ("hit rate", lambda r: f"{r.hit_rate:.3f}"),
        ("KV peak", lambda r: f"{r.kv_peak:.3f}"),
        (
            "above hard: total / longest (s)",
            lambda r: f"{r.above_hard_total_s:.3f} / {r.above_hard_longest_s:.3f}",
        ),
        (
            "sessions moved / offloads / 429s",
            lambda r: f"{r.sessions_moved:.0f} / {r.offloads:.0f} / {r.sheds:.0f}",
        ),
        ("requests held for KV headroom", lambda r: str(r.kv_holds)),
        (
            "requests per worker",
            lambda r: " ".join(map(str, sorted(r.requests_by_worker.values(), reverse=True))),
        ),
        ("wall (s)", lambda r: f"{r.wall_s:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':{width}}  {off.mode:>22}  {on.mode:>22}"]
    lines += [f"{name:{width}}  {fn(off):>22}  {fn(on):>22}" for name, fn in rows]
    cut = off.preemptions / on.preemptions if on.preemptions else float("inf")
    drop = (off.hit_rate - on.hit_rate) / off.hit_rate if off.hit_rate else 0.0
    scrape_s = settings.scrape_ms / 1000
    lines += [
        "",
        f"preemptions cut {cut:.1f}x (target >= 5x); hit rate change {-drop:+.1%} (target >= -10%)",
        f"longest stretch above hard with pressure on: {on.above_hard_longest_s:.3f} s "
        f"= {on.above_hard_longest_s / scrape_s:.1f} scrape intervals (target <= 2); "
        f"failed requests {on.failed} (target 0)",
    ]
    return "\n".join(lines)


async def main(argv: list[str] | None = None) -> int:
    """Run both modes and print (and optionally save) the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    defaults = Settings()
    for name, value in asdict(defaults).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    settings = Settings(**{k: getattr(args, k) for k in asdict(defaults)})
    results = [await run_mode(settings, pressure=False), await run_mode(settings, pressure=True)]
    print(_table(results, settings))
    if args.json:
        document = {"settings": asdict(settings), "modes": [asdict(r) for r in results]}
        Path(args.json).write_text(json.dumps(document, indent=2))  # noqa: ASYNC240 (once, at the end)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
