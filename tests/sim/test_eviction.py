"""The eviction comparison of benchmarks/kv_events_bench.py: paired figures over seeds."""

from __future__ import annotations

from kvgate.sim.eviction import APPROXIMATE, PRECISE, compare, lines


def test_shared_prefix_groups_compare_precise_and_approximate_routing_seed_by_seed() -> None:
    found = compare([1, 2], shapes=["shared-prefix-groups"], lost=True)
    row = found["shared-prefix-groups"]
    assert row["seeds"] == [1, 2]
    for policy in (APPROXIMATE, PRECISE):
        share = row[f"{policy} of reference %"]
        assert share["n"] == 2 and 50.0 < share["value"] < 150.0
        for replay in ("pinned", "split", "greedy", "partition"):
            replayed = row[f"{policy}'s timing: {replay} replay of reference %"]
            assert replayed["n"] == 2 and 0.0 < replayed["value"] < 150.0
        assert row[f"{policy} of pinned reference %"]["n"] == 2
        # Where the hits were lost: the causes add up to the prompt tokens, the
        # reference loses none to another worker, and copies take some of the KV.
        causes = ("hit", "elsewhere", "evicted_here", "evicted_away", "new")
        total = sum(row[f"{policy} lost, pt: {cause}"]["value"] for cause in causes)
        assert abs(total - 100.0) < 0.1
        less = row[f"{policy} lost, pt: elsewhere less the reference's"]
        assert less["value"] == row[f"{policy} lost, pt: elsewhere"]["value"]
        assert row[f"{policy}'s placement, free copies, of reference %"]["value"] > 50.0
        assert 0.0 <= row[f"{policy} copies, % of KV"]["value"] < 100.0
    assert row["hit, events - approximate, pt"]["n"] == 2
    assert row["ttft_p99, events / approximate"]["value"] > 0.0
    text = lines(found)
    assert text[0] == "shared-prefix-groups (seeds 1-2, n=2)"


def test_a_scenario_sets_replicas_and_restarts_and_names_itself() -> None:
    from kvgate.sim.eviction import Scenario
    from kvgate.sim.simulation import SimConfig
    from kvgate.workload.synthetic import build_workload

    config = SimConfig(workers=4, max_requests=40)
    requests = list(config.limited(build_workload("chat", seed=1).requests()))
    assert Scenario().config(config, requests) == config
    assert Scenario().label() == ""
    scenario = Scenario(replicas=2, shared_store=False, restarts=3)
    changed = scenario.config(config, requests)
    assert changed.replicas == 2 and not changed.shared_store
    last = max(r.arrival for r in requests)
    assert [w for _, w in changed.worker_restarts] == [0, 1, 2]
    assert all(0 < at < last for at, _ in changed.worker_restarts)
    assert scenario.label() == "2 replicas, a store each, split by client; 3 worker restarts"
