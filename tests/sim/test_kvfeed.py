"""The simulator's KV event feed: the exact index follows every engine through lost
batches and restarts, and a ``+kv_events`` policy runs beside its approximate self."""

from __future__ import annotations

from typing import Any

from kvgate.sim.experiment import Experiment
from kvgate.sim.kvfeed import KVFeed, split_policy
from kvgate.sim.simulation import SimConfig, Simulation
from kvgate.workload.options import workload_factory
from kvgate.workload.synthetic import build_workload

WORKLOAD = "shared-prefix-groups:groups=12,prompts=10,system_tokens=1024"


def _run(config: SimConfig, policy: str = "default+kv_events") -> tuple[Simulation, dict[str, Any]]:
    workload = build_workload(WORKLOAD, seed=config.seed)
    sim = Simulation(config, workload.requests(), policy)
    return sim, sim.run().summary


def _agrees(feed: KVFeed) -> bool:
    return all(
        feed.index.held_keys(w) == engine.cached_blocks() for w, engine in feed.engines.items()
    )


def test_split_policy() -> None:
    assert split_policy("default+kv_events") == ("default", True)
    assert split_policy("cache_aware") == ("cache_aware", False)


def test_the_index_equals_every_engine_and_credits_nothing_gone() -> None:
    sim, run = _run(SimConfig(workers=3, kv_blocks=(80,), seed=2))
    feed = sim.feed
    assert feed is not None
    assert _agrees(feed)
    summary = feed.summary()
    assert summary["placements"] == run["requests"] - run["shed"] > 0
    assert summary["overclaims"] == 0
    assert summary["orphans"] == 0


def test_lost_batches_and_restarts_recover_within_one_replay() -> None:
    config = SimConfig(
        workers=3,
        kv_blocks=(80,),
        seed=4,
        kv_event_drop=0.1,
        subscriber_restarts=(0.6,),
        worker_restarts=((1.0, 1),),
    )
    sim, _ = _run(config)
    feed = sim.feed
    assert feed is not None
    s = feed.stats
    assert s.dropped > 0 and s.replays > 0 and s.restarts == 2
    # After each fault the index equalled its engine again by the next batch.
    assert s.recovery_batches and max(s.recovery_batches) <= 1
    feed.pump(1e9)  # a last idle probe brings whatever the final drop withheld
    assert _agrees(feed)
    assert s.overclaims / s.placements < 0.05


def test_precise_and_approximate_run_side_by_side() -> None:
    config = SimConfig(workers=3, kv_blocks=(80,), seed=1, max_requests=60)
    experiment = Experiment(
        workload_factory(workload=WORKLOAD, trace=None, seed=config.seed, rate_scale=1.0),
        ["default", "default+kv_events"],
        config,
    )
    (point,) = experiment.run()
    names = [run.policy for run in point.runs]
    assert names == ["default", "default+kv_events"]
    assert "kv_events" in point.runs[1].summary and "kv_events" not in point.runs[0].summary
