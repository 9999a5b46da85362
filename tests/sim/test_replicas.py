"""Several gateway replicas in front of one fleet (``sim.replicas``): each learns only
what it placed, the store is shared or not, and every request is answered once."""

from __future__ import annotations

import dataclasses

import pytest

from kvgate.sim.replicas import Replicas
from kvgate.sim.simulation import SimConfig, Simulation
from kvgate.workload.synthetic import build_workload

WORKLOAD = "headerless-chat"


def _sim(config: SimConfig, policy: str = "default") -> Simulation:
    return Simulation(config, build_workload(WORKLOAD, seed=config.seed).requests(), policy)


@pytest.mark.parametrize("shared", [True, False])
def test_replicas_answer_every_request_once_through_their_own_books(shared: bool) -> None:
    config = SimConfig(workers=3, kv_blocks=(120,), seed=3, max_requests=200)
    sim = _sim(dataclasses.replace(config, replicas=2, shared_store=shared))
    gateways = sim.gateway
    assert isinstance(gateways, Replicas)
    first, second = gateways.gateways
    assert (first.table is second.table) is shared
    assert (first.holders is second.holders) is shared
    assert first.policy is not second.policy
    # Another replica's worker is a view: its own book, the same engine.
    assert second.workers[0] is not first.workers[0]
    assert second.workers[0].engine is first.workers[0].engine
    summary = sim.run().summary
    assert summary["finished"] + summary["shed"] == 200
    assert all(w.in_flight == 0 for g in gateways.gateways for w in g.workers)


def test_one_replica_is_the_plain_gateway() -> None:
    config = SimConfig(workers=3, kv_blocks=(120,), seed=3, max_requests=200)
    plain = _sim(config).run().summary
    one = _sim(dataclasses.replace(config, replicas=1)).run().summary
    assert plain == one


def test_a_conversation_goes_through_one_replica_unless_split_by_request() -> None:
    config = SimConfig(workers=2, kv_blocks=(120,), seed=1, max_requests=60, replicas=3)
    gateways = _sim(config).gateway
    assert isinstance(gateways, Replicas)
    requests = list(config.limited(build_workload(WORKLOAD, seed=1).requests()))
    by_conversation: dict[str, set[int]] = {}
    for request in requests:
        replica = gateways.gateways.index(gateways.replica_of(request))
        by_conversation.setdefault(request.conversation or "", set()).add(replica)
    assert all(len(replicas) == 1 for replicas in by_conversation.values())
    assert len(set().union(*by_conversation.values())) > 1
    with pytest.raises(ValueError, match="replica_split"):
        _sim(dataclasses.replace(config, replica_split="nearest"))


def test_a_worker_restart_clears_its_cache_without_events_too() -> None:
    config = SimConfig(workers=2, kv_blocks=(120,), seed=2, max_requests=300)
    plain = _sim(config).run().summary
    restarted = _sim(dataclasses.replace(config, worker_restarts=((5.0, 0), (10.0, 1))))
    assert restarted.run().summary["hit_rate"] < plain["hit_rate"]


def test_replicas_sharing_a_store_count_each_others_requests_in_flight() -> None:
    """``core.peers`` in virtual time: through one store each replica's snapshot counts
    the others' requests in flight (placements change); with a store each there is
    no one to see, and the run is the one without sharing, to the last digit."""
    config = SimConfig(workers=3, kv_blocks=(120,), seed=3, max_requests=200, replicas=2)
    runs = {}
    for shared in (True, False):
        for every in (0.1, None):
            fleet = dataclasses.replace(config, shared_store=shared, share_loads_s=every)
            sim = _sim(fleet, "default+kv_events")
            gateways = sim.gateway
            assert isinstance(gateways, Replicas)
            seen = []
            arrive = gateways.arrive

            def watch(request, now, arrive=arrive, gateways=gateways, seen=seen):  # type: ignore[no-untyped-def]
                arrive(request, now)
                seen.append(sum(w.routed.peer_in_flight for w in gateways.gateways[1].workers))

            gateways.arrive = watch  # type: ignore[method-assign]
            runs[shared, every] = (sim.run().summary, max(seen))
    assert runs[True, 0.1][1] > 0  # the second replica saw the first's requests
    assert runs[True, None][1] == runs[False, 0.1][1] == 0
    assert runs[True, 0.1][0] != runs[True, None][0]
    assert runs[False, 0.1][0] == runs[False, None][0]
