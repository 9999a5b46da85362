"""A subagent routes under its parent's binding until it has its own (``core.route``,
``under_parent``), whichever policy decides: the rule is the routing pipeline's, and the
parent's worker keeps a session home's limits."""

from __future__ import annotations

import random

import pytest

from kvgate.core.admission import AdmissionConfig
from kvgate.core.decision import Affinity, AffinityWrite
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import FleetSnapshot, Health, Pressure, WorkerState
from kvgate.core.policies import default_registry
from kvgate.core.pressure import PressureConfig
from kvgate.core.route import Place, RouteConfig, Verdict, route, under_parent
from kvgate.types import SessionSource

N, S, H = Pressure.NORMAL, Pressure.SOFT, Pressure.HARD
CONFIG = RouteConfig(AdmissionConfig(), PressureConfig(), kv_gate_max_wait_s=10.0)
POLICIES = pytest.mark.parametrize("name", ["default", "ttft"])
LEAD = Affinity("lead", "b", "v1", 5.0)
"""The parent's binding: its worker is ``b``."""
HOLDERS = {"a": 3, "b": 15, "c": 3}


def w(wid: str, *, pressure: Pressure = N, in_flight: int = 0, limit: int = 4) -> WorkerState:
    return WorkerState(
        id=wid,
        model="m",
        version="v1",
        pressure=pressure,
        in_flight=in_flight,
        max_in_flight=limit,
        health=Health.HEALTHY,
    )


def sub(source: SessionSource = SessionSource.AGENT, key: str | None = "sub") -> RequestFeatures:
    return RequestFeatures(
        request_id="r",
        model="m",
        session_key=key,
        session_source=source,
        prompt_chars=4000,
        max_tokens=16,
        parent_key="lead",
        prefix_hashes=tuple(range(1, 16)),
    )


def placed(
    name: str,
    workers: tuple[WorkerState, ...],
    parent: Affinity | None,
    affinity: Affinity | None = None,
    holders: dict[str, int] | None = None,
) -> Place:
    """The verdict of a fresh policy ``name`` (it has learned nothing) for the subagent;
    ``holders``: the store's (the parent's task's blocks name ``b``, the preamble's others)."""
    verdict: Verdict = route(
        sub(),
        affinity,
        FleetSnapshot(0.0, workers),
        default_registry().build(name),
        random.Random(0),
        queue_depth=0,
        held_s=None,
        config=CONFIG,
        holders=HOLDERS if holders is None else holders,
        parent=parent,
    )
    assert isinstance(verdict, Place)
    return verdict


@POLICIES
def test_a_subagent_goes_to_its_parents_worker_and_is_bound_there_under_its_own_key(
    name: str,
) -> None:
    fleet = (w("a"), w("b", in_flight=1), w("c"))  # the parent's worker is the busier
    if name == "default":
        # Without the parent: ``default`` trusts the store's holders only once it has
        # learned how often they hit, so a fresh replica goes by load (issue 49's finding).
        assert placed(name, fleet, None).worker != "b"
    verdict = placed(name, fleet, LEAD)
    assert (verdict.worker, verdict.reason) == ("b", "affinity_hit")
    # Its own key, new: the compare-and-set expects nothing bound to it yet.
    assert verdict.affinity == AffinityWrite("sub", "b", "v1", expected=None)


@POLICIES
@pytest.mark.parametrize(
    ("parent_worker", "why"),
    [
        pytest.param(w("b", pressure=H), "pressure", id="hard-pressure"),
        pytest.param(w("b", in_flight=4), "overloaded", id="full"),
    ],
)
def test_a_subagent_leaves_its_parents_worker_as_a_session_leaves_its_home(
    name: str, parent_worker: WorkerState, why: str
) -> None:
    verdict = placed(name, (w("a"), parent_worker, w("c")), LEAD)
    assert verdict.worker != "b"
    assert verdict.reason == f"affinity_{why}_migrated"
    assert verdict.affinity == AffinityWrite("sub", verdict.worker, "v1", expected=None)


@POLICIES
def test_a_soft_pressured_parent_worker_still_takes_its_subagent(name: str) -> None:
    """As a session's home under soft pressure: it adds only its own part's KV there."""
    verdict = placed(name, (w("a"), w("b", pressure=S), w("c")), LEAD)
    assert (verdict.worker, verdict.reason) == ("b", "affinity_hit")


@POLICIES
def test_the_subagents_own_binding_leads_once_it_has_one(name: str) -> None:
    own = Affinity("sub", "c", "v1")
    # A bound request looks no holders up (``core.holders.lookup_keys``).
    verdict = placed(name, (w("a"), w("b"), w("c")), LEAD, own, holders={})
    assert (verdict.worker, verdict.reason, verdict.affinity) == ("c", "affinity_hit", None)


def test_under_parent_gives_the_parents_worker_to_the_subagents_own_key() -> None:
    assert under_parent(sub(), None, LEAD) == Affinity("sub", "b", "v1", 5.0)
    own = Affinity("sub", "c", "v1")
    assert under_parent(sub(), own, LEAD) is own
    assert under_parent(sub(), None, None) is None
    # No key of its own to bind, or a continuation (its state is where it was made).
    assert under_parent(sub(key=None), None, LEAD) is None
    assert under_parent(sub(SessionSource.CONTINUATION), None, LEAD) is None
