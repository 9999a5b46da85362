"""The shapes the protocol judges: a workload, the fleet it runs on, and the issue's criteria.

A **scenario** is one row of the judge's table: a registered workload
(``kvgate.workload.synthetic.WORKLOADS``) or a window of a public trace, with the
fleet it is run on (workers, their latency profiles and KV, the clients' concurrency,
a worker slowed mid-run) and what ``default`` must meet against the peers there
(issue 46's "Done means"). The simulator and the live fleet read the same scenario,
so a shape is judged the same way by both.

Every registered workload is judged: those named here with their fleet and
criteria, any other (a workload added later, e.g. agents with tool pauses) on the
default fleet with the default criteria, unless it is one of ``UNJUDGED`` (the
older open-ended generators the peers were never run on). The **held-out** shapes
(``HELD_OUT``) differ in kind from those the default policy was tuned on; they are
judged in the simulator only (``Scenario.sim_only``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvgate.engine.profiles import get_profile
from kvgate.workload.synthetic import WORKLOADS, Workload, build_workload
from kvgate.workload.traces import TRACE_PREFIX, trace_window

H100 = "h100-llama3-8b"
A100 = "a100-llama3-8b"


@dataclass(frozen=True)
class Criterion:
    """One bar a scenario sets: ``metric`` of the judged router against ``against``.

    - ``hit_rate``: the difference in points must be at least ``-bound`` (within
      ``bound`` points of the other router, or above);
    - ``ttft_p50`` / ``ttft_p99`` (``ttft_return_*``: only the turns back from a tool
      call): the ratio must be at most ``bound``;
    - ``slowed_share``: the slowed worker's share of the requests, from
      ``Slowdown.settle_s`` after it slowed, over its speed-proportional share,
      must lie within ``1 ± bound`` (``against`` is ``"speed"``).

    ``against`` is ``"best_peer"`` (per metric, the peer with the best mean over
    the seeds), ``"round_robin"`` (the stateless baseline) or ``"speed"``.
    """

    metric: str
    against: str
    bound: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; known: {', '.join(METRICS)}")
        if self.against not in ("best_peer", "round_robin", "speed"):
            raise ValueError(f"unknown comparison {self.against!r}")
        if (self.metric == "slowed_share") != (self.against == "speed"):
            raise ValueError("the slowed worker's share is judged against its speed, only")

    def describe(self) -> str:
        """The bar in words, e.g. ``p99 <= 1.05x best peer``."""
        name = METRICS[self.metric]
        other = self.against.replace("_", " ")
        if self.metric == "hit_rate":
            return f"{name} >= {other} - {self.bound:g} pt"
        if self.metric == "slowed_share":
            return f"{name} within {self.bound:.0%} of speed-proportional"
        return f"{name} <= {self.bound:g}x {other}"


METRICS: Mapping[str, str] = {
    "hit_rate": "hit",
    "ttft_p50": "TTFT p50",
    "ttft_p99": "TTFT p99",
    "ttft_return_p50": "returning TTFT p50",
    "ttft_return_p99": "returning TTFT p99",
    "slowed_share": "slowed worker's share",
}
"""What a run reports per router, and each metric's short name."""


@dataclass(frozen=True)
class Slowdown:
    """Worker ``worker`` runs at ``speed`` times its profile's rate from model second ``at_s``;
    its share is judged over the requests sent from ``at_s + settle_s`` on."""

    at_s: float
    worker: int
    speed: float = 0.5
    settle_s: float = 30.0


DEFAULT_CRITERIA = (
    Criterion("hit_rate", "best_peer", 0.5),
    Criterion("ttft_p50", "best_peer", 1.05),
    Criterion("ttft_p99", "best_peer", 1.05),
)
"""A scenario that names no bars of its own: ties the best peer on all three."""


@dataclass(frozen=True)
class Scenario:
    """A workload on a fleet, with the bars ``default`` must meet there (see the module)."""

    name: str
    workload: str
    requests: int
    why: str
    workers: int = 4
    profiles: tuple[str, ...] = (H100,)
    kv_blocks: int = 0
    """Each worker's KV blocks of ``block_size`` tokens (0: what the profile's GPU holds)."""
    cpu_offload_blocks: int = 0
    """Each worker's CPU offload tier in blocks (vLLM's CPU offload; 0: none); kvgate is told
    its workers keep what they offload (``offload_url``)."""
    block_size: int = 16
    concurrency: int = 64
    """The most requests the clients have out at once."""
    time_scale: float = 10.0
    """Live: the emulated workers' model seconds per real second. The largest at which the
    emulated fleet keeps up on a quiet two-core machine (its timelines lose under ~1% of
    model time; ``lost`` in the judge's mode column): groups-16x8-tight's burst of 128
    requests lost up to 12% at 4 and nothing at 1, and lost time is in the TTFTs the
    workers report, which then measure the machine instead of the router."""
    slowdown: Slowdown | None = None
    criteria: tuple[Criterion, ...] = DEFAULT_CRITERIA
    live_requests: int | None = None
    """Live: requests per run when fewer than ``requests`` (CPU time)."""
    tags: tuple[str, ...] = field(default=())
    sim_only: bool = False
    """Judged in the simulator only, never live (``live.run_all_live`` leaves it out) nor in
    the ablation the policy is tuned by: the held-out shapes (``HELD_OUT``)."""

    @property
    def workload_name(self) -> str:
        """The registered workload this scenario runs (its spec without options)."""
        return self.workload.partition(":")[0]

    def source(self, seed: int) -> Workload:
        """The requests ``seed`` replays: the registered workload, or a window of ``requests``
        requests of a public trace (``trace:NAME[:rate=R]``, ``workload.traces.trace_window``)."""
        if self.workload.startswith(TRACE_PREFIX):
            return trace_window(self.workload, seed, self.requests)
        return build_workload(self.workload, seed)

    def profile_of(self, worker: int) -> str:
        """Worker ``worker``'s latency profile (profiles are given out in turn)."""
        return self.profiles[worker % len(self.profiles)]

    def speeds(self) -> list[float]:
        """Each worker's prefill rate (tokens per model second) once the slowdown is in force."""
        rates = [get_profile(self.profile_of(i)).prefill_tokens_per_s for i in range(self.workers)]
        if self.slowdown is not None:
            rates[self.slowdown.worker] *= self.slowdown.speed
        return rates

    def expected_share(self) -> float | None:
        """The slowed worker's speed-proportional share of the fleet's work (None: no slowdown).

        Speed is the prefill rate: on these prompts prefill is most of a request's cost.
        """
        if self.slowdown is None:
            return None
        rates = self.speeds()
        return rates[self.slowdown.worker] / sum(rates)


MIXED = (H100, A100)
"""Two H100s and two A100s on four workers (given out in turn)."""

TIE_PEER_LATENCY = (
    Criterion("ttft_p50", "best_peer", 1.05),
    Criterion("ttft_p99", "best_peer", 1.05),
)
NO_WORSE_THAN_ROUND_ROBIN = (
    Criterion("ttft_p50", "round_robin", 1.0),
    Criterion("ttft_p99", "round_robin", 1.0),
)

ISSUE_SHAPES: Mapping[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="uniform-mixed",
            workload="uniform",
            requests=1000,
            live_requests=600,
            profiles=MIXED,
            concurrency=48,
            time_scale=5.0,
            why="no prefix reuse at all, 48 in flight, 2 x H100 + 2 x A100: only balance counts",
            criteria=(*TIE_PEER_LATENCY, *NO_WORSE_THAN_ROUND_ROBIN),
        ),
        Scenario(
            name="uniform-mixed-slowdown",
            workload="uniform",
            requests=1200,
            profiles=MIXED,
            concurrency=48,
            time_scale=5.0,
            slowdown=Slowdown(at_s=20.0, worker=0, speed=0.5, settle_s=30.0),
            why="the same, with one H100 slowed to half speed 20 s in: its share from 30 s later",
            criteria=(
                Criterion("slowed_share", "speed", 0.2),
                *TIE_PEER_LATENCY,
                *NO_WORSE_THAN_ROUND_ROBIN,
            ),
        ),
        Scenario(
            name="groups-16x8-tight",
            workload="shared-prefix-groups:rate=2000",
            requests=128,
            kv_blocks=1000,
            concurrency=128,
            time_scale=1.0,
            why="SGLang's generated shared prefix, 16 groups x 8 prompts, 2k-token system "
            "prompts, all at once, on workers whose KV holds a quarter of the prompts",
            criteria=(Criterion("hit_rate", "best_peer", 1.0), *TIE_PEER_LATENCY),
        ),
        Scenario(
            name="groups-24x10-tight",
            workload="shared-prefix-groups-24x10:rate=2000",
            requests=240,
            kv_blocks=1000,
            concurrency=128,
            time_scale=4.0,
            why="the same at SGLang's second size: 24 groups x 10 prompts",
            criteria=(Criterion("hit_rate", "best_peer", 1.0), *TIE_PEER_LATENCY),
        ),
        Scenario(
            name="conversation-trace",
            workload="shared-opening-trace",
            requests=300,
            kv_blocks=10_000,
            concurrency=64,
            time_scale=15.0,
            why="Mooncake-shaped conversations behind one shared 512-token block, no session "
            "ids, to /v1/completions; the fleet's KV holds about half of what could hit",
            criteria=(
                Criterion("ttft_p50", "best_peer", 1.0),
                Criterion("ttft_p99", "best_peer", 0.85),
            ),
        ),
        Scenario(
            name="session-docs",
            workload="session-docs",
            requests=240,
            kv_blocks=3_000,
            concurrency=32,
            time_scale=15.0,
            why="X-Session-ID sessions with ~4k-token documents, 32 open at once",
            criteria=(
                Criterion("hit_rate", "best_peer", 0.5),
                Criterion("ttft_p99", "best_peer", 1.05),
            ),
        ),
        Scenario(
            name="headerless-chat",
            workload="headerless-chat",
            requests=240,
            kv_blocks=2_000,
            concurrency=64,
            time_scale=12.0,
            why="multi-turn chat behind 4 shared 1,024-token system prompts, no session header",
        ),
        Scenario(
            name="agent-preamble",
            workload="agent-preamble",
            requests=240,
            kv_blocks=2_000,
            concurrency=64,
            time_scale=10.0,
            why="agent loops behind one 4,096-token tool preamble, no session header",
        ),
        Scenario(
            name="agent-tools",
            workload="agent-tools",
            requests=500,
            live_requests=240,
            kv_blocks=900,
            cpu_offload_blocks=8_000,
            concurrency=64,
            time_scale=10.0,
            why="tool-calling agents (issue 49): one 4,096-token preamble, 10-40 turns, "
            "log-normal tool pauses, subagents; each worker's GPU KV holds about one agent's "
            "whole context (what a tool pause leaves behind is what gets evicted), its CPU "
            "tier 8,000 blocks",
            # Issue 49's bars are on the turns that come back from a tool call.
            criteria=(
                Criterion("hit_rate", "best_peer", 0.0),
                Criterion("ttft_return_p50", "best_peer", 0.7),
                Criterion("ttft_return_p99", "best_peer", 0.7),
            ),
        ),
    )
}
"""The shapes the default policy was tuned on (issue 46's, then issue 11's)."""

HELD_OUT: Mapping[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="ragpulse-mixed",
            sim_only=True,
            workload="trace:ragpulse:rate=8",
            requests=300,
            profiles=MIXED,
            kv_blocks=1_500,
            why="real RAG traffic (RAGPulse: a university Q&A service, X-Session-ID sessions, "
            "~3k-token prompts of system prompt, retrieved passages, history and question) on "
            "2 x H100 + 2 x A100 whose KV holds ~8 prompts: 300 requests of the week from a "
            "seeded start, a median gap of 1/8 s",
        ),
        Scenario(
            name="mooncake-mixed-tight",
            sim_only=True,
            workload="trace:mooncake:rate=2",
            requests=200,
            profiles=MIXED,
            kv_blocks=8_000,
            why="the Mooncake trace (15k-token prompts on average, up to 190k, shared 512-token "
            "blocks, no session ids) on 2 x H100 + 2 x A100 whose KV holds ~8 average prompts: "
            "200 requests from a seeded start, a median gap of 1/2 s",
        ),
        Scenario(
            name="chat-bursty",
            sim_only=True,
            workload="chat:arrival=bursty,rate=12,think_s=5,turns_mean=8,user_tokens=200",
            requests=300,
            kv_blocks=1_500,
            why="X-Session-ID chat behind one 512-token system prompt whose sessions start in "
            "on/off bursts (5 s on at four times the mean rate, 15 s off), on KV holding ~6 "
            "conversations a worker",
        ),
        Scenario(
            name="long-docs-uneven",
            sim_only=True,
            workload="rag:documents=24,doc_tokens_min=16000,doc_tokens_max=32000,zipf_s=0.8,"
            "rate=1,question_tokens=80,output_tokens=150",
            requests=200,
            profiles=(H100, A100, A100, A100),
            kv_blocks=4_000,
            concurrency=32,
            why="questions on 24 long documents (16-32k tokens, Zipf-popular, no session ids) "
            "on 1 H100 + 3 A100s (one worker about twice as fast), each worker's KV holding "
            "2-3 documents",
        ),
        Scenario(
            name="groups-48x8-12w",
            sim_only=True,
            workload="shared-prefix-groups:groups=48,prompts=8,rate=2000",
            requests=384,
            workers=12,
            kv_blocks=1_000,
            concurrency=256,
            why="SGLang's generated shared prefix on a larger fleet: 48 groups x 8 prompts, all "
            "at once, 256 in flight on 12 H100s whose KV each holds ~7 of the 2k-token prompts",
        ),
    )
}
"""Held-out shapes nobody tuned on, judged in the simulator only (``Scenario.sim_only``):
traces, bursts, long documents, an uneven fleet, a larger fleet."""

SCENARIOS: Mapping[str, Scenario] = {
    **ISSUE_SHAPES,
    **HELD_OUT,
}
"""Every scenario with a fleet and bars of its own: the tuned shapes, then the held-out."""

UNJUDGED = frozenset({"chat", "system-prompt", "rag", "agent", "shared-prefix-groups"})
"""Registered workloads no scenario runs: the open-ended generators of the first sessions
(judged by ``benchmarks/sim_matrix.py``), and the groups' size SGLang's benchmark does not
run on a tight cache (``groups-16x8-tight`` runs it there)."""


def default_scenario(workload: str) -> Scenario:
    """A registered workload no scenario names, on the default fleet with the default bars."""
    return Scenario(
        name=workload,
        workload=workload,
        requests=240,
        kv_blocks=2_000,
        why=f"the registered workload {workload!r} on 4 H100s with 2,000 KV blocks each",
    )


def judged(workloads: Sequence[str] | None = None) -> list[Scenario]:
    """Every scenario the protocol runs: ``SCENARIOS``, then each registered workload
    (``workloads``: the registry's names) that none of them runs and is not ``UNJUDGED``."""
    names = list(WORKLOADS) if workloads is None else list(workloads)
    covered = {s.workload_name for s in SCENARIOS.values()} | UNJUDGED
    return [*SCENARIOS.values(), *(default_scenario(n) for n in names if n not in covered)]


def by_names(names: Sequence[str]) -> list[Scenario]:
    """The judged scenarios called ``names``; an unknown name is a ``ValueError``."""
    known = {s.name: s for s in judged()}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names]
