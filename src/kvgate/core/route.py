"""The routing pipeline, decided in one pure step: place, hold, queue, shed, or no worker.

Both drivers, the live router (``gateway.dataplane.router``) and the simulator
(``sim.gateway``), call ``route`` with what they know of one request at one
instant and carry out the verdict; neither decides anything on its own. As
httpcore's pool does, the decision is synchronous and returns what to do; the
waiting, the store write and the counting are the driver's.

The steps, in order (each may end it):

1. No routable worker: ``Unavailable`` (HTTP 503).
2. Memory pressure across the whole fleet (``core.pressure.fleet_pressure``, every
   routable worker past the soft mark): sheddable work ``should_shed`` names is shed
   (``Shed("pressure_<level>")``); the rest is routed as on an unpressured fleet
   (``core.pressure.unpressured``) and its placement said ``pressure_overflow``.
3. Admission on the fleet's saturation (``core.admission.admit``): sheddable
   work is refused near saturation; a fleet with no free slot queues or sheds (a
   full queue makes room for a tenant holding less of it: ``Queue.displaces``).
4. A continuation of state one worker holds (``previous_response_id``) goes back
   to that worker while it is routable: ``Place("continuation")``, no policy asked.
   A subagent's request with no binding of its own (``under_parent``) is routed
   under its parent's: the policy sees the parent's worker as the session's home,
   so it goes where the parent's KV is, by the rules a session's own binding
   follows (hard pressure, overload, a lost worker move it), and is bound there
   (or where it went) under its own key.
5. The policy picks. A ``CAPACITY_FULL`` refusal queues (``Queue``) or sheds as
   admission says at full saturation. Any other refusal is the policy's own shed.
6. The KV hold: a pick whose worker lacks KV room to start the request
   (``core.pressure.kv_fits``: its prompt; output still to grow is not counted) is
   held (``Hold``) until a release, at most ``kv_gate_max_wait_s`` in all; past
   that it is placed anyway (the gate delays, never refuses). A pick the policy
   says is worth nothing to the request (``Policy.hold_worth``: another worker
   would serve it as soon) is not waited for: the policy picks again among the
   workers with room for it (``KV_HOLD_MOVED``), and the hold goes on only where
   none has. Without it a bound session whose home had evicted its
   history was held there for seconds, only to recompute it there all the same.
   (Moving a pick that is worth something once held that long, the ski-rental
   rule, gave sessions' caches up for waits that would have ended: not done.)

A driver that waited and was woken, or whose hold's ``max_wait`` ran out, calls
``route`` again with the fleet as it is then (a hold past ``kv_gate_max_wait_s``
is placed at once); one whose queue wait ran out answers ``queue_timeout``.
After the affinity compare-and-set, a replica that lost the race asks
``follows_binding``.

A new admission rule is one more step here, with a row in the table tests
(``tests/core/test_route.py``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kvgate.core.admission import (
    AdmissionConfig,
    Admit,
    Queue,
    Shed,
    Waiting,
    admit,
    displaced,
    fleet_saturation,
    timed_out,
)
from kvgate.core.decision import CAPACITY_FULL, Affinity, AffinityWrite
from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import ROUTABLE_HEALTH, FleetSnapshot, Pressure, WorkerState
from kvgate.core.holders import continues, with_parent
from kvgate.core.policy import Policy, Resident, RouteContext
from kvgate.core.pressure import (
    PressureConfig,
    fleet_pressure,
    kv_demand_tokens,
    kv_fits,
    kv_output_tokens,
    should_shed,
    unpressured,
)
from kvgate.types import Priority, Seconds, SessionSource, WorkerId

__all__ = [
    "CAPACITY_FULL",
    "CONTINUATION",
    "INVALID_DECISION",
    "KV_HOLD_MOVED",
    "NO_HEALTHY_WORKER",
    "Hold",
    "Place",
    "Queue",
    "RouteConfig",
    "Shed",
    "Unavailable",
    "Verdict",
    "follows_binding",
    "queue_displaced",
    "queue_timeout",
    "route",
    "under_parent",
]

OVERFLOW = "pressure_overflow"
"""The reason of a placement on a wholly pressured fleet (``core.pressure.unpressured``)."""

CONTINUATION = "continuation"
"""The reason of a ``Place`` that follows a continuation to the worker holding its state."""

_HOLD_TICK_S = 0.001
"""Waits shorter than this are none: a pick worth less is worth nothing, and a hold with
less left is placed (a shorter wait than a clock can tell from none would wake at the
instant it was asked at, and ask again forever)."""

KV_HOLD_MOVED = "kv_hold_moved"
"""The reason of a placement the KV hold sent elsewhere: its pick had no KV room, and
waiting for it was worth nothing (``Policy.hold_worth``)."""

INVALID_DECISION = "invalid_decision"
"""The shed reason when a policy picks a worker that is not in its snapshot (a policy bug)."""

NO_HEALTHY_WORKER = "no_healthy_worker"
"""The reason of ``Unavailable``: no worker of the model (and version) is routable."""

DEFAULT_RETRY_AFTER_S = 1.0
"""``Retry-After`` of a policy's own shed that suggests none."""

# Enum members as module constants: on 3.11 ``Enum.MEMBER`` goes through
# ``EnumType.__getattr__``'s slot (about 60 ns), and these run on every request.
_NORMAL = Pressure.NORMAL
_SHEDDABLE = Priority.SHEDDABLE
_new = object.__new__
_CONTINUES = SessionSource.CONTINUATION


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """The settings ``route`` reads: admission limits and the KV hold.

    ``kv_gate`` ``None`` turns the hold off (pressure handling off, or its
    ``kv_gate`` switched off).
    """

    admission: AdmissionConfig
    kv_gate: PressureConfig | None = None
    kv_gate_max_wait_s: Seconds = 10.0


@dataclass(frozen=True)
class Place:
    """Send the request to ``worker`` now (no ``slots``: ``route`` makes each one in
    one update of the instance dict, not through the frozen ``__init__``).

    ``version`` is the policy's (``None``: the worker's own); ``affinity`` the
    binding to write with compare-and-set; ``kv_tokens`` the KV demand to count
    in flight on the worker until the request ends.
    """

    worker: WorkerId
    reason: str
    version: str | None = None
    affinity: AffinityWrite | None = None
    kv_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Hold:
    """Wait up to ``max_wait`` for a release, then ask again; if none comes, carry out ``place``."""

    place: Place
    max_wait: Seconds
    reason: str = "kv_hold"


@dataclass(frozen=True, slots=True)
class Unavailable:
    """No worker can serve the request at all (HTTP 503, not a shed)."""

    reason: str = NO_HEALTHY_WORKER


Verdict = Place | Hold | Queue | Shed | Unavailable
"""What the driver must do with a request (``Queue`` and ``Shed`` are ``core.admission``'s)."""


def route(
    request: RequestFeatures,
    affinity: Affinity | None,
    fleet: FleetSnapshot,
    policy: Policy,
    rng: random.Random,
    *,
    queue_depth: int,
    held_s: Seconds | None,
    config: RouteConfig,
    holders: Mapping[WorkerId, int] | None = None,
    resident: Resident | None = None,
    parent: Affinity | None = None,
    waiting: Waiting | None = None,
) -> Verdict:
    """The verdict for ``request`` on ``fleet`` (see the module docs for the steps).

    ``fleet`` holds only the workers the request may use (its model's, its
    assigned version's, less those a retry already tried); ``queue_depth`` is
    how many requests wait in the driver's queue, this one not counted;
    ``held_s`` how long it has been held for KV headroom (``None``: never).
    ``holders`` is the shared store's prefix state for the request
    (``core.holders``); a headerless later turn it shows resident is not new work.
    ``resident`` is what the engines that publish KV events hold of the prompt.
    ``parent`` is the store's binding of the parent session a subagent's request names
    (``RequestFeatures.parent_key``): without a binding of its own, it routes under it,
    and the parent's worker holds as much of its prefix as any (``with_parent``).
    ``waiting`` is the driver's queue per tenant: a full queue then makes room for a
    tenant holding less of it than another (``Queue.displaces``; ``None``: it never does).
    """
    holders = holders if holders is not None else {}
    inherited = False
    if parent is not None and affinity is None:
        holders = with_parent(holders, parent.worker)
        affinity = under_parent(request, None, parent)
        inherited = affinity is not None
    # ``routable`` inlined, without a generator: this runs on every request.
    for worker in fleet.workers:
        if worker.health in ROUTABLE_HEALTH:
            break
    else:
        return Unavailable()
    admission = config.admission
    priority = request.priority
    # Without holders nothing ``continues`` (the lazy path's case: skip the call).
    fresh = affinity is None and not (holders and continues(len(request.prefix_hashes), holders))
    gate = config.kv_gate
    level = fleet_pressure(fleet)
    overflow = level is not _NORMAL
    if overflow:
        if priority is _SHEDDABLE and should_shed(priority, fresh, fleet):
            return Shed(f"pressure_{level}", admission.retry_after_s)
        fleet = unpressured(fleet)
    saturation = fleet_saturation(fleet, admission.kv_saturated)
    verdict = admit(
        admission, priority, queue_depth, saturation, tenant=request.tenant, waiting=waiting
    )
    if not isinstance(verdict, Admit):
        return verdict
    held = _continuation(request, affinity, fleet)
    if held is not None:
        return held
    ctx = RouteContext(fleet, affinity, rng, holders, resident)
    decision = policy.pick(request, ctx)
    if overflow and decision.worker is not None:
        decision = replace(decision, reason=OVERFLOW)
    if decision.worker is None:
        if decision.reason != CAPACITY_FULL:
            # The policy's own refusal (pressure, priority): waiting would not help.
            return Shed(decision.reason, decision.retry_after or DEFAULT_RETRY_AFTER_S)
        return _when_full(admission, request, queue_depth, waiting)
    state = fleet.get(decision.worker)
    if state is None:
        return Shed(INVALID_DECISION, DEFAULT_RETRY_AFTER_S)
    demand = kv_demand_tokens(request, gate, decision.shared_chars) if gate is not None else 0
    place = _new(Place)
    place.__dict__.update(
        worker=decision.worker,
        reason=decision.reason,
        version=decision.version,
        affinity=_own_write(request, state, decision.version) if inherited else decision.affinity,
        kv_tokens=demand,
    )
    if gate is None or kv_fits(state, demand, gate, kv_output_tokens(request, gate)):
        return place
    waited = held_s if held_s is not None else 0.0
    left = config.kv_gate_max_wait_s - waited
    if left < _HOLD_TICK_S:
        return place
    worth = policy.hold_worth(request, place.worker, ctx)
    if worth is not None and worth < _HOLD_TICK_S:
        moved = _with_room(request, ctx, policy, gate, place.worker)
        if moved is not None:
            if inherited:
                to = fleet.get(moved.worker)
                assert to is not None  # ``_with_room`` picks from ``fleet``
                moved = replace(moved, affinity=_own_write(request, to, moved.version))
            return moved
    return Hold(place, left)


def under_parent(
    request: RequestFeatures, affinity: Affinity | None, parent: Affinity | None
) -> Affinity | None:
    """The binding ``request`` is routed under: its own (``affinity``), else, for a
    subagent's request (its own key, not a continuation), its parent's binding
    (``parent``) given to its own key, as Dynamo binds a subagent under its parent.

    The subagent's prompt opens with its parent's (the tool preamble, the task it was
    handed), so the parent's worker holds most of it whatever a replica has learned
    of the store's prefix state: a replica that has routed nothing yet sends it there
    too. As a home, it keeps a home's limits (``core.policies.base.affinity_status``).
    """
    if affinity is not None or parent is None:
        return affinity
    key = request.affinity_key
    if key is None or request.session_source is _CONTINUES:
        return None
    return Affinity(key, parent.worker, parent.version, parent.last_active)


def _own_write(request: RequestFeatures, worker: WorkerState, version: str | None) -> AffinityWrite:
    """The binding to write for a subagent placed under its parent's (``under_parent``):
    its own key, where it went, new (``expected=None``: nothing was bound to it yet),
    whatever the policy wrote for a home it took for the key's own (nothing on a hit,
    the parent's worker as ``expected`` on a move)."""
    key = request.affinity_key
    assert key is not None  # ``under_parent`` inherits only for a keyed request
    return AffinityWrite(key, worker.id, version or worker.version, expected=None)


def needs_affinity(policy: Policy, fleet: FleetSnapshot, split: bool) -> bool:
    """Whether the store's binding for a request could change its verdict on ``fleet``.

    It can when the policy reads or writes bindings, when the model's versions are
    split (a binding keeps its session on its version), or when a worker is under
    pressure or full (pressure shedding spares bound sessions, a soft-pressured
    worker still takes its own, the overflow moves a binding). Otherwise the driver
    may skip the lookup and the touch: the verdict is the same without them.
    """
    if policy.reads_affinity or split:
        return True
    normal = _NORMAL
    # ``full`` inlined, without a generator: the live driver asks on every request.
    for w in fleet.workers:  # noqa: SIM110
        if w.pressure is not normal or w.in_flight >= w.max_in_flight:
            return True
    return False


def _with_room(
    request: RequestFeatures,
    ctx: RouteContext,
    policy: Policy,
    gate: PressureConfig,
    pick: WorkerId,
) -> Place | None:
    """The policy's pick among the workers other than ``pick`` with KV room for the whole
    request (nothing of it counted as shared), or ``None`` where none has room or the
    policy picks none of them."""
    fleet = ctx.fleet
    whole, output = kv_demand_tokens(request, gate), kv_output_tokens(request, gate)
    lacking = frozenset(
        w.id for w in fleet.workers if w.id == pick or not kv_fits(w, whole, gate, output)
    )
    if len(lacking) == len(fleet.workers):
        return None
    view = fleet.without(lacking)
    decision = policy.pick(request, replace(ctx, fleet=view))
    if decision.worker is None or view.get(decision.worker) is None:
        return None
    demand = kv_demand_tokens(request, gate, decision.shared_chars)
    return Place(decision.worker, KV_HOLD_MOVED, decision.version, decision.affinity, demand)


def _continuation(
    request: RequestFeatures, affinity: Affinity | None, fleet: FleetSnapshot
) -> Place | None:
    """A continuation of state its worker holds goes back there while it is routable.

    Not a preference a policy may weigh: another worker would not know the
    conversation (``previous_response_id`` would be a 404), so no policy is asked.
    """
    if request.session_source is not _CONTINUES or affinity is None:
        return None
    state = fleet.get(affinity.worker)
    if state is None or not state.routable:
        return None
    return Place(affinity.worker, CONTINUATION, affinity.version)


def _when_full(
    admission: AdmissionConfig,
    request: RequestFeatures,
    queue_depth: int,
    waiting: Waiting | None,
) -> Queue | Shed:
    """Every candidate is at its in-flight limit: queue, or shed when the queue is no option."""
    verdict = admit(
        admission, request.priority, queue_depth, 1.0, tenant=request.tenant, waiting=waiting
    )
    assert not isinstance(verdict, Admit)  # admit() at full saturation never admits
    return verdict


def queue_timeout(config: RouteConfig, queue_depth: int) -> Shed:
    """The verdict for a request whose queue wait ran out."""
    return timed_out(config.admission, queue_depth)


def queue_displaced(config: RouteConfig, queue_depth: int) -> Shed:
    """The verdict for a waiter whose place went to another tenant's request."""
    return displaced(config.admission, queue_depth)


def follows_binding(
    request: RequestFeatures,
    placed: WorkerId,
    bound: Affinity,
    other: WorkerState | None,
    excluded: frozenset[WorkerId] = frozenset(),
) -> bool:
    """After the compare-and-set: True when the request should move to the binding in force.

    Another replica (or an earlier request of the same session) bound the key
    to ``bound.worker`` first; following it keeps the session on one worker,
    provided that worker (``other``, its state now) serves the model, is
    routable and has a free slot, and a retry has not already tried it.
    """
    if bound.worker == placed or bound.worker in excluded or other is None:
        return False
    return other.model == request.model and other.routable and not other.full
