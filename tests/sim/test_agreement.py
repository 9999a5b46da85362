"""The simulator agrees with the live system (issue 7).

One small multi-turn chat workload is run twice for each registered policy:
live, through the real gateway (``running_gateway``) in front of emulated
workers (``running_worker``, the h100 profile, time-scaled) replayed by
``run_bench``; and in the simulator with the same fleet. Hit rates must agree
within 5 points and the TTFT interquartile mean within 20%.

Why not the median: a request's TTFT depends on whether its prefix was cached,
so the distribution has two modes (hits and misses) with a gap between them.
Where the median falls in that gap, as for ``least_request``, a shift of two
or three requests in a hundred from one mode to the other moves it by 20%
while every other quantile agrees; the mean of the middle half moves by a
fraction of that and, unlike the plain mean, ignores the live run's tail.

Latencies are compared in model time as the workers' engines recorded them
(``EngineDriver.recent``): at a time scale of 10, every real millisecond the
gateway and the client spend in this one Python process would count ten model
milliseconds, which on a shared 2-core machine is noise, not the model. The
health interval is the simulator's scrape interval divided by the time scale.
Decode steps are not fused (``step_horizon_ms=0``): a live engine cannot know
the next arrival, so a fused step would hold back requests the simulator
(which knows it) lets in.

Fleets and workloads compared (``Scenario``), pressure handling on in both
unless said (the gateway's default: levels from the scraped KV, the in-flight
KV estimate, the KV hold):

- the plain chat;
- the same chat on two model versions split 3:1 (a canary's share);
- issue 11's headerless chat (no session id, four shared system prompts), with
  pressure handling off in both: with it on, the live gateway's
  pressure relief (migrating prefix-keyed sessions, which the simulator does
  not model) cost about 8 points of hit rate under round robin when measured;
- the versions on KV tight enough that requests are held for KV headroom in
  both runs. There the live run holds more often than the simulator (a live
  request stays in flight longer by the gateway's and the client's own time,
  which the time scale multiplies, so the in-flight KV estimate is higher), and
  its hit rate trailed by 2 to 17 points depending on the machine's load: that
  scenario checks that pressure engages in both, not that they agree.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from kvgate.bench import run_bench
from kvgate.bench.payloads import PayloadBuilder
from kvgate.core.policies import default_registry, with_time_scale
from kvgate.core.pressure import PressureConfig
from kvgate.core.warmup import WARM_UP_MAX_TOKENS
from kvgate.engine import Engine, EngineConfig, EngineRequest
from kvgate.engine.tokenizer import tokenize
from kvgate.gateway.testing import running_gateway
from kvgate.sim.simulation import SimConfig, Simulation
from kvgate.workersim import WorkerHandle, WorkerOptions, running_worker
from kvgate.workersim.driver import Finished, FirstToken
from kvgate.workersim.protocol import ChatCompletionRequest
from kvgate.workload.prompts import CHARS_PER_TOKEN, segment_text
from kvgate.workload.request import SimRequest
from kvgate.workload.synthetic import build_workload

SCALE = 10.0
WORKERS = 4
KV_BLOCKS = 1000  # a few conversations per worker: where a turn goes decides its hits
BLOCK_SIZE = 16
SCRAPE_S = 2.0  # model seconds between metric scrapes, in both runs
REQUESTS = 300
WORKLOAD = "chat:rate=8,think_s=1,turns_mean=6,user_tokens=300,output_tokens=10"
MODEL = "demo"


@dataclass(frozen=True)
class Scenario:
    """One fleet and workload both runs share."""

    workload: str = WORKLOAD
    kv_blocks: int = KV_BLOCKS
    versions: tuple[str, ...] = ("default",)
    """Assigned to the workers in turn."""
    weights: tuple[tuple[str, float], ...] = ()
    """The model's split by version (``()``: not split)."""
    pressure: bool = True
    max_shed: float = 0.0
    """The fraction of requests either run may shed (429)."""
    scale: float = SCALE
    """Model seconds per real second in the live run."""

    def version_of(self, index: int) -> str:
        return self.versions[index % len(self.versions)]


PLAIN = Scenario()
VERSIONS = Scenario(versions=("v1", "v2"), weights=(("v1", 3.0), ("v2", 1.0)), max_shed=0.05)
TIGHT = Scenario(
    kv_blocks=500, versions=("v1", "v2"), weights=(("v1", 3.0), ("v2", 1.0)), max_shed=0.1
)
"""KV tight enough that both runs hold requests for headroom every time (the simulator
holds 7 at 500 blocks; at 700 it held 1, and a live run on a busy machine sometimes none)."""
HEADERLESS = Scenario(
    workload="headerless-chat:rate=8,think_s=1,turns_mean=6,user_tokens=300,output_tokens=10",
    pressure=False,
)
"""Issue 11's headerless chat (4 shared 1024-token system prompts), at this test's scale."""
SHARED_OPENING = Scenario(
    workload=(
        "shared-opening-trace:rate=4,opening_tokens=256,block_tokens=128,first_blocks=4,"
        "turn_blocks=1,turns_mean=4,think_s=2,output_tokens=10"
    ),
    pressure=False,
)
"""Issue 11's first shape, small: no session ids, every prompt opening with the same
block; the prefix chain (and, live, the store's prefix holders) is all that ties a
conversation to its worker."""


# -- tokenization ---------------------------------------------------------------------


def test_pseudo_text_reads_at_the_codecs_chars_per_token() -> None:
    """The engine's tokenizer counts the workload's tokens in the sim's pseudo-text."""
    builder = PayloadBuilder(MODEL)
    chat = build_workload("chat", 3).requests()
    for _ in range(50):
        request = next(chat)
        body = builder.payload(request).body
        tokens = len(ChatCompletionRequest.model_validate(body).parsed_prompt().tokens)
        # The chat template adds a few tokens per message on top of the content.
        assert tokens / request.prompt_tokens == pytest.approx(1.0, rel=0.1)
    # A trace's request (Mooncake's 512-token blocks, a negative id for its own tail)
    # is sent as a completions prompt: the bare pseudo-text.
    trace_like = SimRequest.of(0.0, "t", ((0, 512), (1, 512), (-1, 300)), 8)
    tokens = len(tokenize(builder.prompt(trace_like)))
    assert tokens / trace_like.prompt_tokens == pytest.approx(1.0, rel=0.1)
    for seg_id in (0, 1, 17_575, 17_576, -3, 10**12):
        text = segment_text(seg_id, 400 * CHARS_PER_TOKEN)
        assert len(tokenize(text)) == pytest.approx(400, rel=0.1)


def test_pseudo_text_is_distinct_per_segment() -> None:
    ids = range(-2000, 20_000)
    assert len({segment_text(i, 8 * CHARS_PER_TOKEN) for i in ids}) == len(ids)


# -- the real-time driver keeps model time -------------------------------------------


async def test_unloaded_worker_reports_the_engines_own_latencies() -> None:
    """At a large time scale, model time neither drifts nor adds per-step overhead."""
    options = WorkerOptions(port=0, time_scale=SCALE, kv_blocks=KV_BLOCKS, step_horizon_ms=0)
    expected = Engine(EngineConfig(num_gpu_blocks=KV_BLOCKS))  # the same model, virtual time
    observed_lag: list[float] = []
    async with running_worker(options) as worker:
        driver = worker.worker.driver
        # 20 requests on a loop that kept up; at most as many again that saw a stall.
        for i in range(40):
            if len(observed_lag) == 20:
                break
            request = EngineRequest(f"r{i}", list(range(i * 100, i * 100 + 31)), 500, 40)
            # In virtual time, as the simulator runs it: steps back to back from arrival.
            expected.submit(request, 0.0)
            now, done = 0.0, None
            while done is None:
                step = expected.step(now)
                now += step.duration
                done = step.finished[0] if step.finished else None
            jumps = driver.lag_jumps
            queue = driver.submit(request)
            first_seen = None
            while True:
                event = await queue.get()
                if isinstance(event, FirstToken):
                    first_seen = driver.now()
                if isinstance(event, Finished):
                    info = event.info
                    break
            driver.release(request.request_id)
            if driver.lag_jumps > jumps:
                # The process was descheduled for over ``_MAX_LAG_S`` (a busy machine):
                # the timeline jumped forward, as documented, which only ever delays.
                assert info.e2e >= done.e2e * 0.99
                continue
            assert info.ttft == pytest.approx(done.ttft, rel=0.01)
            assert info.e2e == pytest.approx(done.e2e, rel=0.01)
            assert first_seen is not None
            observed_lag.append(first_seen - info.first_token_time)
    assert len(observed_lag) == 20
    # Never delivered early; late only by the event loop's wake-up, not times the steps.
    assert min(observed_lag) >= 0.0
    assert statistics.median(observed_lag) < 0.003 * SCALE


# -- live and simulated runs of every policy -----------------------------------------


PINNED: dict[str, dict[str, object]] = {"ttft": {"learn": False}}
"""Options both runs pin. ``ttft`` learns each worker's speed from the TTFTs the gateway
observes (``core.speed``): live, in this one time-scaled process on a shared machine, that
measures the process's own delays ten times over, which the module docs call noise, not
the model; so both runs keep the prior, and the learning is judged in the simulator."""


def gateway_config(urls: list[str], policy: str, scenario: Scenario) -> dict[str, object]:
    config: dict[str, object] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "workers": [
            {"url": url, "model": MODEL, "version": scenario.version_of(i)}
            for i, url in enumerate(urls)
        ],
        "expose_worker_urls": True,  # answers are attributed to worker URLs
        "policy": {
            "name": policy,
            # The policy's rates are model time: the live fleet runs scale times faster.
            "options": with_time_scale(
                default_registry(), policy, PINNED.get(policy, {}), scenario.scale
            ),
        },
        "health": {"interval_s": SCRAPE_S / scenario.scale, "timeout_s": 1.0},
        "pressure": {"enabled": scenario.pressure},
        "seed": 0,
    }
    if scenario.weights:
        config["models"] = {MODEL: {"weights": dict(scenario.weights)}}
    return config


@dataclass(frozen=True)
class Run:
    """What one run (live or simulated) measured."""

    hit_rate: float
    ttft_iqm: float
    """Interquartile mean of the engines' own TTFTs, model seconds."""
    finished: int
    shed: int
    errors: int
    kv_holds: int
    workers: tuple[str, ...] = ()
    """The workers' ids (the live run's are their URLs, on free ports)."""


def interquartile_mean(values: Sequence[float]) -> float:
    """The mean of the middle half of ``values``: a typical value, robust to modes and tails."""
    ordered = sorted(values)
    quarter = len(ordered) // 4
    return statistics.fmean(ordered[quarter : len(ordered) - quarter])


async def live_run(policy: str, scenario: Scenario) -> Run:
    """Hit rate (from usage, end to end), engine TTFTs (model s), outcomes, KV holds."""
    async with contextlib.AsyncExitStack() as stack:
        handles: list[WorkerHandle] = []
        for i in range(WORKERS):
            options = WorkerOptions(
                port=0,
                model=MODEL,
                version=scenario.version_of(i),
                kv_blocks=scenario.kv_blocks,
                block_size=BLOCK_SIZE,
                time_scale=scenario.scale,
                step_horizon_ms=0,
                seed=i,
            )
            handles.append(await stack.enter_async_context(running_worker(options)))
        urls = [h.url for h in handles]
        config = gateway_config(urls, policy, scenario)
        gateway = await stack.enter_async_context(running_gateway(config))
        results = await run_bench(
            gateway.url,
            build_workload(scenario.workload, 0),
            requests=REQUESTS,
            model=MODEL,
            time_scale=scenario.scale,
            workers=urls,
            label=policy,
            block_size=BLOCK_SIZE,
        )
        # The clients' requests only: the gateway's warm-ups (one token each) are not
        # requests, and the simulator does not count them either.
        recent = [done for h in handles for done in h.worker.driver.recent]
        ttfts = [done.ttft for done in recent if done.output_tokens > WARM_UP_MAX_TOKENS]
        holds = gateway.gateway.router.kv_holds
    summary = results["policies"][policy]
    assert summary["finished"] == len(ttfts)
    return Run(
        summary["hit_rate"],
        interquartile_mean(ttfts),
        summary["finished"],
        summary["shed"],
        summary["errors"],
        holds,
        tuple(urls),
    )


def simulated_run(policy: str, scenario: Scenario, workers: Sequence[str] = ()) -> Run:
    """The same measures in the simulator, its workers named ``workers`` if given."""
    config = SimConfig(
        workers=WORKERS,
        kv_blocks=(scenario.kv_blocks,),
        block_size=BLOCK_SIZE,
        scrape_interval=SCRAPE_S,
        max_requests=REQUESTS,
        pressure=PressureConfig() if scenario.pressure else None,
        versions=scenario.versions,
        version_weights=scenario.weights,
        seed=0,
        worker_ids=tuple(workers),
    )
    requests = build_workload(scenario.workload, 0).requests()
    sim = Simulation(config, requests, policy, dict(PINNED.get(policy, {})))
    summary = sim.run().summary
    ttft = interquartile_mean(sim.recorder.ttft)
    return Run(
        summary["hit_rate"], ttft, summary["finished"], summary["shed"], 0, sim.gateway.kv_holds
    )


async def both(policy: str, scenario: Scenario) -> tuple[Run, Run]:
    """Run both; every request finished or was shed (within ``max_shed``), none failed."""
    live = await live_run(policy, scenario)
    # Named as the live workers: consistent_hash's rendezvous order is by worker id, and
    # the default ids (sim-w00...) rank sessions differently from any four live URLs (at
    # twelve sets of four URL ids its hit rate here ran 76.3 to 79.9%, at sim-w00... 81.2%).
    sim = simulated_run(policy, scenario, live.workers)
    for run in (live, sim):
        assert run.errors == 0
        assert run.finished + run.shed == REQUESTS
        assert run.shed <= scenario.max_shed * REQUESTS, (live, sim)
    return live, sim


RANDOMISED = frozenset({"random", "power_of_two"})
"""Policies that draw workers at random: live and simulated runs draw different workers,
since what is in flight at each draw depends on the live run's timing. Live runs of
power_of_two on this scenario alone gave 60.2% and 56.2% (CI, 2026-12-01), so for
these the hit rates must agree within 7 points, not 5."""


async def agree(policy: str, scenario: Scenario) -> tuple[Run, Run]:
    """Run both and assert they agree; returns (live, simulated)."""
    live, sim = await both(policy, scenario)
    tolerance = 0.07 if policy in RANDOMISED else 0.05
    assert abs(live.hit_rate - sim.hit_rate) <= tolerance, (live, sim)
    assert live.ttft_iqm == pytest.approx(sim.ttft_iqm, rel=0.2), (live, sim)
    return live, sim


@pytest.mark.parametrize("policy", list(default_registry()))
async def test_live_and_simulated_runs_agree(policy: str) -> None:
    await agree(policy, PLAIN)


COVERING = ("default", "session_affinity", "prefix_affinity", "round_robin")
"""The policies the extra scenarios run (affine and stateless; each live run costs ~12 s)."""


@pytest.mark.parametrize("policy", COVERING)
async def test_they_agree_on_two_versions(policy: str) -> None:
    await agree(policy, VERSIONS)


async def test_on_tight_kv_both_hold_requests_for_headroom() -> None:
    live, sim = await both("default", TIGHT)
    assert live.kv_holds > 0 and sim.kv_holds > 0, (live, sim)


@pytest.mark.parametrize("policy", ("default", "round_robin"))
async def test_they_agree_on_headerless_sessions_with_a_shared_opening(policy: str) -> None:
    await agree(policy, HEADERLESS)


@pytest.mark.parametrize("policy", ("default", "prefix_affinity", "round_robin"))
async def test_they_agree_on_a_shared_opening_without_session_ids(policy: str) -> None:
    await agree(policy, SHARED_OPENING)


LONG_ANSWERS = Scenario(
    workload=(
        "shared-opening-trace:rate=4,opening_tokens=256,block_tokens=128,first_blocks=4,"
        "turn_blocks=1,turns_mean=4,think_s=3,output_tokens=300"
    ),
    kv_blocks=500,
    pressure=False,
)
"""Long answers no later prompt re-sends, on KV where they decide what is evicted."""


async def test_answers_no_one_re_sends_take_the_same_room_live_and_simulated() -> None:
    """The engines cache a trace's answers in both runs, so round robin's hits agree closely.

    Round robin places by arrival order alone, so both runs send the same requests to
    the same workers and only the caches can differ. When the simulator left a
    reply-less request's output out of its engine, it read 43.7% here against the
    live 41.1%; with it, 41.3%.
    """
    live, sim = await both("round_robin", LONG_ANSWERS)
    assert abs(live.hit_rate - sim.hit_rate) <= 0.01, (live, sim)
