"""``TtftConfig``: the options of the ``ttft`` policy (``core.policies.ttft``)."""

from __future__ import annotations

from pydantic import Field

from kvgate.core.policies.learning import CostConfig
from kvgate.core.prefix_index import PrefixIndexConfig


class TtftIndexConfig(PrefixIndexConfig):
    """``ttft``'s prefix index: it remembers four times a worker's KV, not two, so how full
    a worker's cache is with what was sent there (``PrefixIndex.fill``, uncapped up to
    that) still tells workers apart once every cache is full: with two, every worker of a
    session fleet read "full" within 20 s and new sessions went by queue alone, piling onto
    some workers until their sessions' histories evicted each other (session-docs: turns
    missing at home 74k tokens a run against cache_aware's 30k)."""

    kv_overcommit: float = Field(default=4.0, ge=0.1)


class TtftConfig(CostConfig):
    """Options of ``ttft``: the speed prior, the eviction weight (``CostConfig``), and each
    term's switch (the ablation in ``benchmarks/ablation.py`` turns them off one at a time)."""

    decode_s: float = Field(default=0.005, ge=0)
    """The time to first token each request decoding on a worker adds: a prior, not fitted
    (see ``TtftPolicy``). 5 ms: at 2 ms a worker slowed to half speed kept 40-50% of its
    speed-proportional share (uniform-mixed-slowdown), the rest went to the faster ones."""
    overhead_s: float = Field(default=0.005, ge=0)
    """The prior of a worker's fixed time to first token (scheduling, the first step)."""
    learn: bool = True
    """Learn each worker's speed from its observed TTFTs (``core.speed``); off: the prior."""
    forgetting: float = Field(default=0.96, gt=0.5, le=1)
    """Weight each older observation keeps per newer one in the speed fit."""
    engine_queue: bool = False
    """Count the work the engine reports waiting beyond this replica's own (another
    replica's); off: this replica's book alone. Off by default: in the simulator's
    single-replica shapes the scrape's lag reads finished work as others' (mixed
    no-reuse p50 0.95x with it off, ``docs/runs/ablation_ttft.json``); a fleet shared by
    several replicas is where it can earn its place."""
    delay_cap: float = Field(default=2.0, ge=0)
    """The most later requests a placement's prefill is counted to delay (0: not counted).
    Per candidate: its share of the arrival rate times how long it stays busy (the
    shortest queue among the candidates, plus this prefill there): a burst's rate says
    more about the burst than about how many it will delay, hence the cap."""
    kv_high: float = Field(default=0.9, gt=0, le=1)
    """KV use at which a worker is skipped while another is below it."""
    index: TtftIndexConfig = TtftIndexConfig()
