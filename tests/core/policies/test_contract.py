"""The contract every registered policy keeps, on fixed tables and on random fleets."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgate.core.decision import Affinity, Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import FleetSnapshot, Health, Pressure, WorkerState
from kvgate.core.policies import DEFAULT_POLICY, default_registry
from kvgate.core.policy import Policy, PolicyBase, RouteContext
from kvgate.core.registry import UnknownPolicyError

from .tables import chain, ctx, fleet, request, worker

REGISTRY = default_registry()
NAMES = sorted(REGISTRY)


def check(
    decision: Decision,
    req: RequestFeatures,
    context: RouteContext,
) -> None:
    """The invariants of one decision."""
    assert decision.reason, "every decision says why"
    if decision.shed:
        assert decision.retry_after is not None and decision.retry_after > 0
        assert decision.affinity is None
        return
    chosen = context.fleet.get(decision.worker or "")
    assert chosen is not None, "a decision names a worker of the snapshot"
    assert chosen.routable and not chosen.full
    assert decision.version == chosen.version
    if req.pinned_version is not None:
        assert chosen.version == req.pinned_version
    bound = context.affinity.worker if context.affinity is not None else None
    if chosen.id == bound:
        assert chosen.pressure is not Pressure.HARD
    elif not chosen.accepts_new_sessions:
        # Only a headerless request may (``candidates``: pressure turns away new
        # sessions; a policy may weigh a pressured worker for headerless work).
        assert req.session_key is None, "a new session never lands on a pressured worker"
    if decision.affinity is not None:
        assert decision.affinity.worker == chosen.id
        assert decision.affinity.session_key == req.affinity_key
        assert decision.affinity.expected == bound


def test_every_policy_is_registered_with_a_config_and_builds_with_defaults() -> None:
    assert DEFAULT_POLICY in REGISTRY
    assert set(NAMES) >= {
        "round_robin",
        "random",
        "least_request",
        "power_of_two",
        "session_affinity",
        "prefix_affinity",
        "consistent_hash",
        "default",
    }
    for name in NAMES:
        policy = REGISTRY.build(name)
        assert isinstance(policy, Policy)
        assert isinstance(policy, PolicyBase)
        assert policy.name == name
        assert policy.__class__.__doc__
        assert REGISTRY[name].summary


def test_unknown_names_and_options_fail_at_start_up() -> None:
    with pytest.raises(UnknownPolicyError):
        REGISTRY.build("fastest")
    for name in NAMES:
        with pytest.raises(ValueError, match=name):
            REGISTRY.build(name, {"no_such_option": 1})


def test_registries_and_policies_share_no_state() -> None:
    one, two = (
        default_registry().build("prefix_affinity"),
        default_registry().build("prefix_affinity"),
    )
    one.on_routed(request(hashes=chain(1, 4)), "a", 0.0)
    snapshot = fleet(worker("a", in_flight=1), worker("b"))
    assert one.pick(request(hashes=chain(1, 4)), ctx(snapshot)).worker == "a"
    assert two.pick(request(hashes=chain(1, 4)), ctx(snapshot)).worker == "b"


NOTHING_QUALIFIES = [
    pytest.param((), None, "no_worker", id="empty"),
    pytest.param(
        (worker("a", health=Health.EJECTED), worker("b", health=Health.DRAINING)),
        None,
        "no_healthy_worker",
        id="unhealthy",
    ),
    pytest.param(
        (worker("a", in_flight=256), worker("b", in_flight=300)), None, "capacity_full", id="full"
    ),
    pytest.param(
        (worker("a", pressure=Pressure.SOFT), worker("b", pressure=Pressure.HARD)),
        None,
        "capacity_full",
        id="pressured",
    ),
    pytest.param((worker("a", pressure=Pressure.HARD),), "a", "capacity_full", id="hard-affine"),
    pytest.param((worker("a", version="v1"),), None, "no_worker", id="pinned-elsewhere"),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("workers", "bound_to", "reason"), NOTHING_QUALIFIES)
def test_refuses_with_a_reason_when_nothing_qualifies(
    name: str, workers: tuple[WorkerState, ...], bound_to: str | None, reason: str
) -> None:
    policy = REGISTRY.build(name)
    pinned = "v2" if reason == "no_worker" and workers else None
    req = request(session="s", hashes=chain(1, 4), pinned=pinned)
    context = ctx(fleet(*workers), bound_to)
    decision = policy.pick(req, context)
    check(decision, req, context)
    assert (decision.shed, decision.reason) == (True, reason)


# -- random fleets ------------------------------------------------------------

workers_strategy = st.lists(
    st.builds(
        lambda i, health, pressure, cap, used, waiting, kv, version: WorkerState(
            id=f"w{i}",
            model="m",
            version=version,
            health=health,
            pressure=pressure,
            in_flight=min(used, cap + 1),
            max_in_flight=cap,
            waiting=waiting,
            kv_usage=kv,
            kv_capacity_tokens=4096,
        ),
        i=st.integers(0, 30),
        health=st.sampled_from(list(Health)),
        pressure=st.sampled_from(list(Pressure)),
        cap=st.integers(1, 6),
        used=st.integers(0, 7),
        waiting=st.none() | st.integers(0, 4),
        kv=st.none() | st.floats(0, 1),
        version=st.sampled_from(["v1", "v2"]),
    ),
    max_size=8,
    unique_by=lambda w: w.id,
)

requests_strategy = st.builds(
    lambda n, session, group, length, pinned: request(
        f"r{n}",
        session=session,
        hashes=chain(group, length),
        pinned=pinned,
    ),
    n=st.integers(0, 10**6),
    session=st.none() | st.sampled_from(["s1", "s2", "s3"]),
    group=st.integers(0, 3),
    length=st.integers(0, 6),
    pinned=st.none() | st.just("v1"),
)


def run(
    policy: Policy,
    workers: list[WorkerState],
    history: list[tuple[RequestFeatures, str]],
    req: RequestFeatures,
    *,
    bound_to: str | None,
    seed: int,
) -> tuple[Decision, RouteContext]:
    for earlier, where in history:
        policy.on_routed(earlier, where, 0.0)
        policy.on_usage(earlier, where, 64, 0, 0.0)
    affinity = Affinity(req.affinity_key or "k", bound_to, "v1") if bound_to else None
    context = RouteContext(FleetSnapshot(1.0, tuple(workers)), affinity, random.Random(seed))
    return policy.pick(req, context), context


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workers=workers_strategy,
    history=st.lists(
        st.tuples(requests_strategy, st.sampled_from([f"w{i}" for i in range(6)])), max_size=6
    ),
    req=requests_strategy,
    route=st.tuples(st.none() | st.sampled_from(["w0", "w1", "w2", "gone"]), st.integers(0, 2**32)),
)
def test_invariants_hold_on_random_fleets(
    name: str,
    workers: list[WorkerState],
    history: list[tuple[RequestFeatures, str]],
    req: RequestFeatures,
    route: tuple[str | None, int],
) -> None:
    bound_to, seed = route
    decision, context = run(
        REGISTRY.build(name), workers, history, req, bound_to=bound_to, seed=seed
    )
    check(decision, req, context)
    again, _ = run(REGISTRY.build(name), workers, history, req, bound_to=bound_to, seed=seed)
    assert again == decision, "same inputs and seed, same decision"


@pytest.mark.parametrize(
    ("session", "pressure", "allowed"),
    [
        # Headerless, on a pressured worker: whatever it holds (pressure turns away new
        # sessions only; a policy weighs a pressured worker for headerless work).
        (None, Pressure.SOFT, True),
        (None, Pressure.HARD, True),
        ("s1", Pressure.SOFT, False),  # a new session never
        ("s1", Pressure.HARD, False),
    ],
)
def test_the_check_lets_a_pressured_worker_take_only_headerless_work(
    session: str | None, pressure: Pressure, allowed: bool
) -> None:
    snapshot = fleet(worker("w0", pressure=pressure), worker("w1"))
    req = request("r1", session=session, hashes=chain(0, 4))
    decision = Decision("w0", "prefix_match", snapshot.workers[0].version)
    if allowed:
        check(decision, req, ctx(snapshot))
    else:
        with pytest.raises(AssertionError, match="never lands on a pressured worker"):
            check(decision, req, ctx(snapshot))
