"""The routing pipeline as a table: fleet and request in, verdict out (``core.route``)."""

from __future__ import annotations

import random

import pytest

from kvgate.core.admission import AdmissionConfig, Queue, Shed
from kvgate.core.decision import CAPACITY_FULL, Affinity, AffinityWrite, Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import FleetSnapshot, Health, Pressure, WorkerState
from kvgate.core.policies import default_registry
from kvgate.core.policies.base import candidates
from kvgate.core.policy import Policy, PolicyBase, RouteContext
from kvgate.core.pressure import PressureConfig
from kvgate.core.route import (
    CONTINUATION,
    INVALID_DECISION,
    KV_HOLD_MOVED,
    OVERFLOW,
    Hold,
    Place,
    RouteConfig,
    Verdict,
    follows_binding,
    queue_timeout,
    route,
)
from kvgate.types import Priority, SessionSource

N, S, H = Pressure.NORMAL, Pressure.SOFT, Pressure.HARD
CRIT, STD, SHED = Priority.CRITICAL, Priority.STANDARD, Priority.SHEDDABLE
GATE = PressureConfig(chars_per_token=1.0, default_output_tokens=100)
CONFIG = RouteConfig(AdmissionConfig(), GATE, kv_gate_max_wait_s=10.0)


def w(
    wid: str,
    *,
    pressure: Pressure = N,
    in_flight: int = 0,
    limit: int = 4,
    health: Health = Health.HEALTHY,
    kv_in_flight: int = 0,
    capacity: int | None = None,
) -> WorkerState:
    return WorkerState(
        id=wid,
        model="m",
        pressure=pressure,
        in_flight=in_flight,
        max_in_flight=limit,
        health=health,
        kv_in_flight_tokens=kv_in_flight,
        kv_capacity_tokens=capacity,
    )


class Fixed(PolicyBase):
    """A policy that always answers the same decision (to test what surrounds a pick)."""

    name = "fixed"

    def __init__(self, decision: Decision) -> None:
        self.decision = decision

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        return self.decision


def verdict_of(
    workers: tuple[WorkerState, ...],
    *,
    decision: Decision | None = None,
    priority: Priority = STD,
    affine: str | None = None,
    queue_depth: int = 0,
    held_s: float | None = None,
    prompt_chars: int = 100,
    config: RouteConfig = CONFIG,
    policy: str = "least_request",
) -> Verdict:
    request = RequestFeatures(
        request_id="r",
        model="m",
        session_key="s",
        priority=priority,
        prompt_chars=prompt_chars,
        max_tokens=100,
    )
    affinity = Affinity("s", affine, "default") if affine is not None else None
    picker = Fixed(decision) if decision is not None else default_registry().build(policy)
    return route(
        request,
        affinity,
        FleetSnapshot(0.0, workers),
        picker,
        random.Random(0),
        queue_depth=queue_depth,
        held_s=held_s,
        config=config,
    )


def kind(verdict: Verdict) -> tuple[str, str]:
    """The verdict's type and its worker (placed or held) or reason."""
    if isinstance(verdict, Place):
        return ("place", verdict.worker)
    if isinstance(verdict, Hold):
        return ("hold", verdict.place.worker)
    return (type(verdict).__name__.lower(), verdict.reason)


FULL = {"in_flight": 4}


@pytest.mark.parametrize(
    ("workers", "kw", "expected"),
    [
        pytest.param((w("a"), w("b", in_flight=1)), {}, ("place", "a"), id="least-loaded"),
        pytest.param(
            (w("a", health=Health.EJECTED), w("b", health=Health.DRAINING)),
            {},
            ("unavailable", "no_healthy_worker"),
            id="no-routable-worker",
        ),
        pytest.param((), {}, ("unavailable", "no_healthy_worker"), id="empty-fleet"),
        # Every worker SOFT: new sheddable work is shed; the rest is placed as on an
        # unpressured fleet (``core.pressure.unpressured``), the engines queue it.
        pytest.param(
            (w("a", pressure=S),), {"priority": SHED}, ("shed", "pressure_soft"), id="soft-new"
        ),
        pytest.param((w("a", pressure=S),), {}, ("place", "a"), id="soft-new-standard-placed"),
        pytest.param(
            (w("a", pressure=S, in_flight=1, kv_in_flight=1000, capacity=1000),),
            {},
            ("hold", "a"),
            id="soft-fleet-still-held-for-kv",
        ),
        pytest.param(
            (w("a", pressure=S), w("b", pressure=S, in_flight=2)),
            {"priority": CRIT},
            ("place", "a"),
            id="soft-critical-overflows",
        ),
        pytest.param(
            (w("a", pressure=S), w("b", pressure=S, in_flight=2)),
            {"affine": "b", "policy": "default"},
            ("place", "b"),
            id="soft-affine-stays",
        ),
        # Every worker HARD: affine sheddable work goes too, affine standard stays.
        pytest.param(
            (w("a", pressure=H),),
            {"affine": "a", "priority": SHED},
            ("shed", "pressure_hard"),
            id="hard-affine-sheddable",
        ),
        pytest.param(
            (w("a", pressure=H),), {"affine": "a"}, ("place", "a"), id="hard-affine-standard"
        ),
        # Saturation: sheddable refused near it; full fleet queues, or sheds with no wait.
        pytest.param(
            (w("a", in_flight=10, limit=10), w("b", in_flight=9, limit=10)),
            {"priority": SHED},
            ("shed", "sheddable_saturated"),
            id="sheddable-near-saturation",
        ),
        pytest.param((w("a", **FULL),), {}, ("queue", "queued"), id="full-queues"),
        pytest.param(
            (w("a", **FULL),),
            {"queue_depth": 819},
            ("shed", "queue_full"),
            id="full-standard-share-of-queue",
        ),
        pytest.param(
            (w("a", **FULL),),
            {"queue_depth": 819, "priority": CRIT},
            ("queue", "queued"),
            id="full-critical-reserve",
        ),
        pytest.param(
            (w("a", in_flight=3),),
            {"decision": Decision.refuse(CAPACITY_FULL)},
            ("queue", "queued"),
            id="policy-says-full",
        ),
        pytest.param(
            (w("a"),),
            {"decision": Decision.refuse("too_hot", 7.0)},
            ("shed", "too_hot"),
            id="policy-sheds",
        ),
        pytest.param(
            (w("a"),),
            {"decision": Decision("ghost", "bug")},
            ("shed", INVALID_DECISION),
            id="unknown-worker",
        ),
        # The KV hold: 100 prompt tokens (and 100 of output) against 950 of headroom on
        # 1000; the one request in flight has its typical output (100) still to grow.
        pytest.param(
            (w("a", in_flight=1, kv_in_flight=950, capacity=1000),),
            {},
            ("place", "a"),
            id="kv-fits",
        ),
        pytest.param(
            (w("a", in_flight=1, kv_in_flight=1000, capacity=1000),),
            {},
            ("hold", "a"),
            id="kv-hold",
        ),
        # Three in flight: 300 of their 1,100 is output still to grow, not waited for.
        pytest.param(
            (w("a", in_flight=3, kv_in_flight=1100, capacity=1000),),
            {},
            ("place", "a"),
            id="kv-output-still-to-grow-not-waited-for",
        ),
        pytest.param(
            (w("a", in_flight=1, kv_in_flight=1000, capacity=1000),),
            {"held_s": 10.0},
            ("place", "a"),
            id="kv-hold-ran-out",
        ),
        pytest.param(
            (w("a", in_flight=1, kv_in_flight=1000, capacity=1000),),
            {"config": RouteConfig(AdmissionConfig())},
            ("place", "a"),
            id="kv-gate-off",
        ),
        pytest.param(
            (w("a", kv_in_flight=5000, capacity=1000),),
            {},
            ("place", "a"),
            id="kv-alone-runs-anyway",
        ),
    ],
)
def test_route(
    workers: tuple[WorkerState, ...], kw: dict[str, object], expected: tuple[str, str]
) -> None:
    assert kind(verdict_of(workers, **kw)) == expected  # type: ignore[arg-type]


def test_a_place_carries_the_decision_and_the_kv_demand() -> None:
    write = AffinityWrite("s", "a", "v2", expected="b")
    verdict = verdict_of((w("a"), w("b")), decision=Decision("a", "affinity_hit", "v2", write))
    assert verdict == Place("a", "affinity_hit", "v2", write, kv_tokens=200)
    no_gate = verdict_of((w("a"),), config=RouteConfig(AdmissionConfig()))
    assert isinstance(no_gate, Place) and no_gate.kv_tokens == 0


def test_a_wholly_pressured_fleet_places_where_there_is_room_and_counts_the_kv() -> None:
    workers = (w("a", pressure=H, in_flight=1, kv_in_flight=100, capacity=1000),)
    verdict = verdict_of(workers, affine="a")
    assert verdict == Place("a", OVERFLOW, "default", None, kv_tokens=200)


def test_a_hold_waits_what_is_left_of_its_time_and_knows_where_to_go() -> None:
    workers = (w("a", in_flight=1, kv_in_flight=1000, capacity=1000),)
    verdict = verdict_of(workers, held_s=4.0)
    assert isinstance(verdict, Hold)
    assert verdict.max_wait == pytest.approx(6.0)
    assert verdict.place == Place("a", "least_loaded", "default", None, kv_tokens=200)


def test_a_prompt_cached_on_a_near_full_worker_is_placed_not_held() -> None:
    # 900 of 1000 tokens started (one request in flight, 100 of output still to grow),
    # the hard mark at 950: its 100-token prompt does not fit; with its prompt cached
    # there, it needs no new KV to start (shared blocks are not taken twice).
    workers = (w("a", in_flight=1, kv_in_flight=1000, capacity=1000),)
    cold = verdict_of(workers, decision=Decision("a", "prefix_match"))
    assert isinstance(cold, Hold) and cold.place.kv_tokens == 200
    warm = verdict_of(workers, decision=Decision("a", "prefix_match", shared_chars=100))
    assert warm == Place("a", "prefix_match", None, None, kv_tokens=100)


def test_queue_and_shed_carry_their_waits() -> None:
    queued = verdict_of((w("a", **FULL),), priority=CRIT)
    assert queued == Queue(30.0)
    no_wait = RouteConfig(AdmissionConfig(max_wait_standard_s=0))
    shed = verdict_of((w("a", **FULL),), config=no_wait)
    assert isinstance(shed, Shed) and shed.reason == "saturated" and shed.retry_after >= 1.0
    late = queue_timeout(CONFIG, 512)
    assert late.reason == "queue_timeout" and late.retry_after == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("bound", "other", "excluded", "follows"),
    [
        ("b", w("b"), frozenset(), True),
        ("a", w("a"), frozenset(), False),  # this replica won
        ("b", w("b", **FULL), frozenset(), False),
        ("b", w("b", health=Health.EJECTED), frozenset(), False),
        ("b", w("b"), frozenset({"b"}), False),  # a retry already failed there
        ("b", None, frozenset(), False),  # the bound worker left the fleet
        ("b", WorkerState(id="b", model="other"), frozenset(), False),
    ],
)
def test_following_the_binding_another_replica_won(
    bound: str, other: WorkerState | None, excluded: frozenset[str], follows: bool
) -> None:
    request = RequestFeatures(request_id="r", model="m", session_key="s")
    affinity = Affinity("s", bound, "default")
    assert follows_binding(request, "a", affinity, other, excluded) is follows


def continuation_verdict(workers: tuple[WorkerState, ...], affine: str | None) -> Verdict:
    """A ``previous_response_id`` request bound to ``affine``, under a policy that prefers ``b``."""
    request = RequestFeatures(
        request_id="r",
        model="m",
        session_key="response:resp_1",
        session_source=SessionSource.CONTINUATION,
    )
    affinity = Affinity("response:resp_1", affine, "v1") if affine is not None else None
    return route(
        request,
        affinity,
        FleetSnapshot(0.0, workers),
        Fixed(Decision("b", "least_loaded")),
        random.Random(0),
        queue_depth=0,
        held_s=None,
        config=CONFIG,
    )


def test_a_continuation_goes_back_to_the_worker_holding_its_state_whatever_the_policy() -> None:
    assert continuation_verdict((w("a"), w("b")), "a") == Place("a", CONTINUATION, "v1")
    # Its worker is gone or not routable: the policy places it (the worker will say 404).
    assert kind(continuation_verdict((w("b"),), "a")) == ("place", "b")
    down = w("a", health=Health.EJECTED)
    assert kind(continuation_verdict((down, w("b")), "a")) == ("place", "b")
    assert kind(continuation_verdict((w("a"), w("b")), None)) == ("place", "b")


# Which workers a request may use while one is pressured: a pressured worker takes no
# new conversations; a bound session's turns come back unless it is hard (hard pressure
# moves sessions away).
@pytest.mark.parametrize(
    ("pressure", "bound", "expected"),
    [
        pytest.param(S, None, ["a"], id="soft-new-conversation"),
        pytest.param(H, None, ["a"], id="hard-new-conversation"),
        pytest.param(S, "b", ["a", "b"], id="soft-session-comes-back"),
        pytest.param(H, "b", ["a"], id="hard-session-moved-away"),
        pytest.param(N, None, ["a", "b"], id="normal"),
    ],
)
def test_a_session_may_come_back_to_its_pressured_worker(
    pressure: Pressure, bound: str | None, expected: list[str]
) -> None:
    request = RequestFeatures(request_id="r", model="m", prefix_hashes=tuple(range(10)))
    fleet = FleetSnapshot(0.0, (w("a"), w("b", pressure=pressure)))
    affinity = Affinity("s", bound, "v1") if bound is not None else None
    ctx = RouteContext(fleet, affinity, random.Random(0))
    assert [x.id for x in candidates(request, ctx)] == expected


# A worker holding most of a request's prompt (its policy says which) still takes it
# under soft pressure, where it adds only the request's own part's KV; hard pressure
# keeps it off all the same, and holding changes nothing on a normal worker.
@pytest.mark.parametrize(
    ("pressure", "holding", "expected"),
    [
        pytest.param(S, ("b",), ["a", "b"], id="soft-holder-takes-it"),
        pytest.param(S, ("a",), ["a"], id="soft-holder-elsewhere"),
        pytest.param(H, ("b",), ["a"], id="hard-holder-does-not"),
        pytest.param(N, ("b",), ["a", "b"], id="normal"),
        pytest.param(S, (), ["a"], id="soft-holds-nothing"),
    ],
)
def test_a_soft_worker_takes_a_request_whose_prompt_it_holds(
    pressure: Pressure, holding: tuple[str, ...], expected: list[str]
) -> None:
    request = RequestFeatures(request_id="r", model="m", prefix_hashes=tuple(range(10)))
    fleet = FleetSnapshot(0.0, (w("a"), w("b", pressure=pressure)))
    ctx = RouteContext(fleet, None, random.Random(0))
    got = candidates(request, ctx, holding)  # type: ignore[arg-type]
    assert [x.id for x in got] == expected


class Prefers(PolicyBase):
    """Picks ``wanted`` when it is among the candidates it may use, else says full."""

    name = "prefers"

    def __init__(self, wanted: str) -> None:
        self.wanted = wanted

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        if any(w.id == self.wanted for w in candidates(request, ctx)):
            return Decision(self.wanted, "its_cache")
        return Decision.refuse(CAPACITY_FULL)


# On a wholly pressured fleet, work that is not shed is the policy's pick among every
# open worker, as if none were pressured (``core.pressure.unpressured``), said
# ``pressure_overflow``; a full worker is still no candidate.
@pytest.mark.parametrize(
    ("workers", "wanted", "expected"),
    [
        pytest.param(
            (w("a", pressure=S), w("b", pressure=S, in_flight=2)),
            "b",
            "b",
            id="soft-the-policy-weighs-load-and-cache",
        ),
        pytest.param(
            (w("a", pressure=H), w("b", pressure=S, in_flight=3)),
            "a",
            "a",
            id="hard-weighed-like-the-others",
        ),
        pytest.param(
            (w("a", pressure=H), w("b", pressure=H, in_flight=3)),
            "b",
            "b",
            id="all-hard-bound-to-a-any-open-worker",
        ),
    ],
)
def test_an_overflow_is_placed_by_the_policy(
    workers: tuple[WorkerState, ...], wanted: str, expected: str
) -> None:
    all_hard = all(x.pressure is H for x in workers)
    request = RequestFeatures(
        request_id="r", model="m", session_key="s", priority=STD if all_hard else CRIT
    )
    verdict = route(
        request,
        Affinity("s", "a", "default") if all_hard else None,
        FleetSnapshot(0.0, workers),
        Prefers(wanted),
        random.Random(0),
        queue_depth=0,
        held_s=None,
        config=RouteConfig(AdmissionConfig()),
    )
    assert isinstance(verdict, Place)
    assert (verdict.worker, verdict.reason) == (expected, OVERFLOW)


# Its own part longer than the system prompt (b holds less than half of it), or a
# one-block question (b holds most of it): the policy weighs both workers either way.
@pytest.mark.parametrize("own", [40, 1])
def test_defaults_overflow_goes_to_the_worker_holding_its_prompt(own: int) -> None:
    """Both workers SOFT; b holds the 32-block system prompt (an earlier request's, with
    its own question after it: this one is a new conversation, not that one's next
    turn), a is idle: the policy's expected TTFT (its cache against a's empty queue)
    sends it to b, where least pressure then least load sent it to a."""
    policy = default_registry().build("default")
    prompt = tuple(range(32))
    policy.on_routed(
        RequestFeatures("w", "m", prefix_hashes=(*prompt, 1007), prompt_chars=33 * 256), "b", -60.0
    )
    hashes = (*prompt, *range(2000, 2000 + own))
    request = RequestFeatures(
        "r", "m", priority=CRIT, prefix_hashes=hashes, prompt_chars=len(hashes) * 256
    )
    workers = (w("a", pressure=S), w("b", pressure=S, in_flight=1))
    verdict = route(
        request,
        None,
        FleetSnapshot(0.0, workers),
        policy,
        random.Random(0),
        queue_depth=0,
        held_s=None,
        config=RouteConfig(AdmissionConfig()),
    )
    assert isinstance(verdict, Place) and (verdict.worker, verdict.reason) == ("b", OVERFLOW)


class Worth(PolicyBase):
    """Picks the first of ``order`` among the workers it is shown; says waiting for
    KV room on its pick is worth ``worth`` seconds."""

    name = "worth"

    def __init__(self, order: str, worth: float | None) -> None:
        self.order, self.worth = order, worth

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        shown = {x.id for x in ctx.fleet.workers}
        wid = next(x for x in self.order if x in shown)
        write = AffinityWrite("s", wid, "default", expected="a") if wid != "a" else None
        return Decision(wid, "its_cache", affinity=write)

    def hold_worth(self, request: RequestFeatures, worker: str, ctx: RouteContext) -> float | None:
        return self.worth


# 900 started (100 of the 1,000 is output still to grow): a 100-token prompt does not fit.
FULL_KV = {"in_flight": 1, "kv_in_flight": 1000, "capacity": 1000}
ROOM = {"in_flight": 1, "kv_in_flight": 100, "capacity": 1000}


# The KV hold does not wait for a pick that is worth nothing to the request (``Policy.
# hold_worth``: the best other worker would serve it as soon): the policy picks among the
# workers with room. A pick worth something is waited for as before (up to 10 s), and
# where no other worker has room, so is one worth nothing.
@pytest.mark.parametrize(
    ("b", "worth", "held", "expected", "wait"),
    [
        pytest.param(ROOM, None, None, ("hold", "a"), 10.0, id="no-measure-waits-for-its-pick"),
        pytest.param(ROOM, 2.0, None, ("hold", "a"), 10.0, id="worth-something-waits"),
        pytest.param(ROOM, 2.0, 2.5, ("hold", "a"), 7.5, id="and-keeps-waiting-its-time"),
        pytest.param(ROOM, 0.0, None, ("place", "b"), None, id="worth-nothing-moves-at-once"),
        pytest.param(ROOM, 0.0, 3.0, ("place", "b"), None, id="or-when-asked-again"),
        pytest.param(FULL_KV, 0.0, None, ("hold", "a"), 10.0, id="no-room-elsewhere-waits"),
        pytest.param(ROOM, 0.0, 10.0, ("place", "a"), None, id="ran-out-placed-at-its-pick"),
    ],
)
def test_a_hold_does_not_wait_for_a_pick_worth_nothing(
    b: dict[str, int], worth: float | None, held: float | None, expected: tuple[str, str],
    wait: float | None,
) -> None:  # fmt: skip
    workers = (w("a", **FULL_KV), w("b", **b))
    request = RequestFeatures("r", "m", session_key="s", prompt_chars=100, max_tokens=100)
    verdict = route(
        request,
        Affinity("s", "a", "default"),
        FleetSnapshot(0.0, workers),
        Worth("ab", worth),
        random.Random(0),
        queue_depth=0,
        held_s=held,
        config=CONFIG,
    )
    assert kind(verdict) == expected
    if isinstance(verdict, Hold):
        assert verdict.max_wait == pytest.approx(wait)
    elif verdict.worker == "b":  # moved: the policy's own decision, said so, KV counted
        write = AffinityWrite("s", "b", "default", expected="a")
        assert verdict == Place("b", KV_HOLD_MOVED, None, write, kv_tokens=200)


def test_defaults_bound_session_waits_at_home_only_while_its_history_is_there() -> None:
    """a holds the session's 40-block history, b and c its 4-block opening; a's KV is full,
    c has room. Waiting at a is worth at least recomputing the 36 blocks only a holds (at
    the policy's rate), so it waits; once the history is gone from a (a fresh policy knows
    nothing of it), a is worth nothing over c, and the session moves to c at once, bound
    there in place of a."""
    history = tuple(range(40))
    request = RequestFeatures(
        "r", "m", session_key="s", prefix_hashes=(*history, 99), prompt_chars=41 * 256,
        max_tokens=100,
    )  # fmt: skip
    workers = (
        w("a", in_flight=1, kv_in_flight=9_000, capacity=10_000),
        w("b", in_flight=1, kv_in_flight=9_000, capacity=10_000),
        w("c", in_flight=1, capacity=10_000),
    )
    config = RouteConfig(AdmissionConfig(), PressureConfig(), kv_gate_max_wait_s=10.0)

    def verdict(policy: Policy, held_s: float | None) -> Verdict:
        return route(
            request,
            Affinity("s", "a", "default"),
            FleetSnapshot(0.0, workers),
            policy,
            random.Random(0),
            queue_depth=0,
            held_s=held_s,
            config=config,
        )

    warm = default_registry().build("default")
    earlier = [(RequestFeatures("h", "m", prefix_hashes=history, prompt_chars=40 * 256), "a")]
    for other in ("b", "c"):
        opening = RequestFeatures(other, "m", prefix_hashes=history[:4], prompt_chars=4 * 256)
        earlier.append((opening, other))
    for done, where in earlier:  # routed and answered: cached there, nothing in flight
        warm.on_routed(done, where, 0.0)
        warm.on_usage(done, where, done.prompt_chars // 4, 0, 1.0)
    ctx = RouteContext(FleetSnapshot(0.0, workers), None, random.Random(0))
    worth = warm.hold_worth(request, "a", ctx)
    recompute = 36 * 256 / 4 / 12_000  # the tokens only a holds, at the policy's rate
    assert recompute <= worth < 1.05 * recompute  # and what they would evict on c
    held = verdict(warm, None)
    assert isinstance(held, Hold) and held.place.worker == "a"
    assert held.max_wait == pytest.approx(10.0)
    cold = default_registry().build("default")
    moved = verdict(cold, None)
    assert isinstance(moved, Place) and (moved.worker, moved.reason) == ("c", KV_HOLD_MOVED)
    assert moved.affinity is not None and moved.affinity.expected == "a"


def test_a_full_queue_makes_room_for_another_tenant_both_ways_to_it() -> None:
    # At the fleet's saturation (admission) and on the policy's capacity_full refusal.
    waiting = {"flood": [0, 819, 0]}
    for decision in (None, Decision.refuse(CAPACITY_FULL)):
        workers = (w("a", **FULL),) if decision is None else (w("a", in_flight=3),)
        picker = (
            Fixed(decision) if decision is not None else default_registry().build("least_request")
        )
        for tenant, expected in (("other", Queue(10.0, displaces=("flood", STD))), ("flood", None)):
            request = RequestFeatures(request_id="r", model="m", tenant=tenant)
            verdict = route(
                request,
                None,
                FleetSnapshot(0.0, workers),
                picker,
                random.Random(0),
                queue_depth=819,
                held_s=None,
                config=CONFIG,
                waiting=waiting,
            )
            if expected is None:
                assert isinstance(verdict, Shed) and verdict.reason == "queue_full"
            else:
                assert verdict == expected
