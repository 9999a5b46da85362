"""The simulator end to end: determinism, accounting, and policies measured against each other."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvgate.sim.experiment import Experiment
from kvgate.sim.report import results_json
from kvgate.sim.simulation import SimConfig, Simulation
from kvgate.workload.options import workload_factory
from kvgate.workload.synthetic import build_workload

SHARED_PREFIX = "system-prompt:prompts=24,rate=12"


def results_bytes(seed: int) -> bytes:
    config = SimConfig(workers=3, kv_blocks=(300,), seed=seed, max_requests=250)
    make = workload_factory(workload="chat:rate=8", trace=None, seed=seed, rate_scale=1.0)
    experiment = Experiment(make, ["random", "power_of_two", "default"], config)
    return json.dumps(results_json(experiment.run(), config)).encode()


def test_same_seed_gives_identical_results_bytes() -> None:
    first = results_bytes(seed=7)
    assert first == results_bytes(seed=7)
    assert first != results_bytes(seed=8)


@pytest.mark.parametrize("policy", ["round_robin", "session_affinity", "default"])
def test_every_request_is_accounted_for_and_the_fleet_drains(policy: str) -> None:
    config = SimConfig(workers=3, kv_blocks=(200,), max_requests=300)
    workload = build_workload("agent:rate=15", seed=2)
    sim = Simulation(config, workload.requests(), policy)
    summary = sim.run().summary
    assert summary["requests"] == 300
    assert summary["finished"] + summary["shed"] == 300
    assert sum(summary["served"].values()) == summary["finished"]
    assert all(w.in_flight == 0 and not w.engine.has_work() for w in sim.workers)
    assert not sim.gateway.flights
    assert 0.0 <= summary["hit_rate"] <= 1.0
    assert summary["ttft_p50"] <= summary["ttft_p99"] <= summary["e2e_p99"]
    # Each request's TTFT is at least its prefill alone with the cache it got, so the
    # p99 of those floors is at most the p99 of the TTFTs.
    assert 0.0 < summary["ttft_floor_p99"] <= summary["ttft_p99"]


def test_overload_queues_then_sheds_instead_of_queueing_forever() -> None:
    admission = SimConfig().admission.model_copy(
        update={"worker_max_in_flight": 2, "queue_size": 10, "max_wait_standard_s": 0.5}
    )
    config = SimConfig(workers=2, admission=admission, max_requests=400)
    workload = build_workload("rag:rate=200", seed=1)
    summary = Simulation(config, workload.requests(), "least_request").run().summary
    assert summary["shed"] > 0
    assert set(summary["sheds"]) <= {"queue_full", "queue_timeout", "saturated"}
    assert summary["finished"] + summary["shed"] == 400
    assert summary["queue_mean"] > 0.0


def test_a_policy_run_as_a_peer_has_no_pressure_handling_and_the_others_keep_it() -> None:
    """A long-context trace on small caches: inside the gateway the fleet is wholly
    pressured at times, and what it places then is said ``pressure_overflow``; run as a
    peer router runs it, nothing is pressured, and the run is the one with pressure
    handling off."""
    config = SimConfig(kv_blocks=(3000,), block_size=16, seed=1, max_requests=120)
    make = workload_factory(
        workload="shared-opening-trace:rate=6", trace=None, seed=1, rate_scale=1.0
    )
    both = ["cache_aware", "round_robin"]
    (inside,) = Experiment(make, both, config).run()
    (point,) = Experiment(make, both, config, as_peers=frozenset({"cache_aware"})).run()
    gateway = {run.policy: run.summary for run in inside.runs}
    summary = {run.policy: run.summary for run in point.runs}
    assert gateway["cache_aware"]["reasons"].get("pressure_overflow", 0) > 0
    assert "pressure_overflow" not in summary["cache_aware"]["reasons"]
    assert summary["cache_aware"]["shed"] == 0 and summary["cache_aware"]["as_peer"]
    bare = dataclasses.replace(config, pressure=None)
    alone = Simulation(bare, make({}).requests(), "cache_aware").run().summary
    assert alone["hit_rate"] == summary["cache_aware"]["hit_rate"]
    assert summary["round_robin"] == gateway["round_robin"]  # not named: as before
    with pytest.raises(ValueError, match="not among the policies: default"):
        Experiment(make, both, config, as_peers=frozenset({"default"}))


def test_prefix_aware_policy_beats_round_robin_on_shared_prefixes() -> None:
    config = SimConfig(workers=4, kv_blocks=(400,), max_requests=500)
    make = workload_factory(workload=SHARED_PREFIX, trace=None, seed=5, rate_scale=1.0)
    (point,) = Experiment(make, ["round_robin", "prefix_affinity"], config).run()
    rr, prefix = (run.summary for run in point.runs)
    # Measured, not built in: round robin spreads every prompt over every worker and
    # the small caches thrash; prefix affinity partitions the prompts.
    assert prefix["hit_rate"] > rr["hit_rate"] + 0.1
    assert prefix["hit_rate"] <= point.bound.hit_rate + 1e-9
    assert prefix["ttft_p90"] < rr["ttft_p90"]


def test_default_spreads_chat_sessions_and_keeps_them_without_session_ids() -> None:
    """Issue 4 on a small fleet: sessions with their own document behind a few shared
    system prompts, sent with no session id: only their own prefix chain ties the
    turns together (issue 11: no key is derived from the opening)."""
    config = SimConfig(workers=8, max_requests=800)
    spec = "chat:rate=30,system_prompts=3,doc_tokens=1500,session_ids=false"
    make = workload_factory(workload=spec, trace=None, seed=1, rate_scale=1.0)
    stateless = ["round_robin", "least_request", "consistent_hash"]
    (point,) = Experiment(make, [*stateless, "default"], config).run()
    *others, default = (run.summary for run in point.runs)
    # Nothing is bound: later turns found their worker by their own chain.
    assert "affinity_hit" not in default["reasons"]
    assert default["reasons"]["prefix_match"] > 600
    assert default["hit_rate"] >= 0.9 * point.bound.hit_rate
    assert all(default["hit_rate"] > other["hit_rate"] + 0.2 for other in others)
    assert all(default["ttft_p90"] < other["ttft_p90"] for other in others)
    # No herding: no worker took much more than its share. (Load is placed by what it
    # costs a request, so with caches far from full and short queues a cold worker may
    # stay nearly idle: recomputing a shared system prompt there would cost each
    # request more than waiting. The request-count spread of issue 4 is not a target.)
    served = default["served"].values()
    assert max(served) <= 1.6 * sum(served) / len(served)


def test_sweep_over_workers_and_a_policy_option() -> None:
    config = SimConfig(max_requests=120)
    make = workload_factory(workload="chat:rate=6", trace=None, seed=1, rate_scale=1.0)
    points = Experiment(make, ["round_robin"], config, {}, "workers", ["1", "3"]).run()
    assert [p.value for p in points] == [1, 3]
    assert [len(p.runs[0].summary["served"]) for p in points] == [1, 3]
    points = Experiment(make, ["prefix_affinity"], config, {}, "match_threshold", ["0.1", "0.9"])
    options = [p.runs[0].options for p in points.run()]
    assert options == [{"match_threshold": "0.1"}, {"match_threshold": "0.9"}]
    with pytest.raises(ValueError, match="cannot sweep"):
        Experiment(make, ["round_robin"], config, {}, "bogus", ["1"]).check()


def test_named_workers_take_the_keys_a_live_fleet_of_those_ids_would() -> None:
    """``consistent_hash`` ranks workers by id: named as a live fleet's URLs, the simulated
    fleet serves each session where that fleet would, and other names shuffle them."""
    urls = tuple(f"http://127.0.0.1:{port}" for port in (39513, 43543, 46573, 35055))

    def served(ids: tuple[str, ...]) -> dict[str, int]:
        config = SimConfig(workers=4, kv_blocks=(400,), max_requests=200, worker_ids=ids)
        sim = Simulation(
            config, build_workload("chat:rate=8", seed=3).requests(), "consistent_hash"
        )
        return dict(sim.run().summary["served"])

    named = served(urls)
    assert set(named) == set(urls)
    assert served(urls) == named  # the same ids, the same placement
    default = served(())
    assert set(default) == {f"sim-w{i:02d}" for i in range(4)}
    # Renaming alone moves sessions: the counts per rank are not the same multiset.
    assert sorted(named.values()) != sorted(default.values())


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (("a", "b"), "names 2 workers, not 4"),
        (("a", "a", "b", "c"), "distinct"),
        (("a", "", "b", "c"), "non-empty"),
    ],
)
def test_worker_ids_must_name_every_worker_once(ids: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(workers=4, worker_ids=ids)


def test_a_worker_slowed_mid_run_gets_slower_and_a_load_aware_policy_sends_it_less() -> None:
    workload = build_workload("uniform:rate=40,prompt_tokens=1024,output_tokens=32", seed=1)
    base = SimConfig(workers=2, block_size=16, max_requests=400, client_concurrency=16)
    slowed = dataclasses.replace(base, slowdowns=((4.0, 0, 0.25),))
    runs = {}
    for name, config in (("base", base), ("slowed", slowed)):
        sim = Simulation(config, workload.requests(), "least_request")
        runs[name] = sim.run()
        assert [w.engine.speed for w in sim.workers] == (
            [1.0, 1.0] if name == "base" else [0.25, 1.0]
        )
    base_shares, slowed_shares = (runs[n].recorder.shares(6.0) for n in ("base", "slowed"))
    assert base_shares[0] == pytest.approx(0.5, abs=0.05)
    assert slowed_shares[0] < 0.35  # a quarter the speed: fewer requests fit there
    before = runs["slowed"].recorder.shares(0.0, 4.0)
    assert before[0] == pytest.approx(0.5, abs=0.05)  # the same before the slowdown
    assert runs["slowed"].summary["ttft_p99"] > runs["base"].summary["ttft_p99"]
    with pytest.raises(ValueError, match="slowdown"):
        SimConfig(workers=2, slowdowns=((1.0, 2, 0.5),))
