"""``TtftConfig``: the options of the ``ttft`` policy (``core.policies.ttft``)."""

from __future__ import annotations

from pydantic import Field

from kvgate.core.policies.base import PolicyConfig
from kvgate.core.prefix_index import PrefixIndexConfig


class TtftIndexConfig(PrefixIndexConfig):
    """``ttft``'s prefix index: it remembers four times a worker's KV, not two, so how full
    a worker's cache is with what was sent there (``PrefixIndex.fill``, uncapped up to
    that) still tells workers apart once every cache is full: with two, every worker of a
    session fleet read "full" within 20 s and new sessions went by queue alone, piling onto
    some workers until their sessions' histories evicted each other (session-docs: turns
    missing at home 74k tokens a run against cache_aware's 30k)."""

    kv_overcommit: float = Field(default=4.0, ge=0.1)


class TtftConfig(PolicyConfig):
    """Options of ``ttft``: the speed prior, the eviction weight, and each term's switch
    (the ablation in ``benchmarks/ablation.py`` turns them off one at a time)."""

    prefill_tokens_per_s: float = Field(default=12_000.0, gt=0)
    """The prior of a worker's prefill rate (an H100 running an 8B model does 10-15k/s)."""
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
    evict: float = Field(default=1.0, ge=0)
    """Weight of the predicted cost of what a placement evicts (0: not counted)."""
    kv_high: float = Field(default=0.9, gt=0, le=1)
    """KV use at which a worker is skipped while another is below it."""
    time_scale: float = Field(default=1.0, gt=0)
    """Model seconds per second of the driver's clock: the priors above are the model's,
    and an emulated fleet run ``--time-scale 10`` does ten model seconds a second."""
    restorable_credit: float = Field(default=0.9, ge=0, le=1)
    """What a prefix block restorable from disk is worth on any worker, against one in
    the worker's own cache (1): llama.cpp restores a saved slot in 2-15% of the time it
    takes to recompute it (``benchmarks/real_offload.py``)."""
    index: TtftIndexConfig = TtftIndexConfig()
