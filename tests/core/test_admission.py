"""Admission: admit, queue or shed by priority, queue depth and fleet saturation."""

from __future__ import annotations

import pytest

from kvgate.core.admission import (
    QUEUE_SHARE,
    AdmissionConfig,
    Admit,
    Queue,
    Shed,
    admit,
    displaced,
    fleet_saturation,
    share_room,
    timed_out,
    wait_order,
)
from kvgate.core.fleet import FleetSnapshot, Health, WorkerState
from kvgate.types import Priority

CONFIG = AdmissionConfig(queue_size=10, standard_queue_share=0.5, sheddable_shed_at=0.9)
C, S, X = Priority.CRITICAL, Priority.STANDARD, Priority.SHEDDABLE


@pytest.mark.parametrize(
    ("priority", "depth", "saturation", "expected"),
    [
        (S, 0, 0.2, Admit()),
        (X, 0, 0.5, Admit()),
        (X, 0, 0.9, Shed),
        (X, 0, 1.0, Shed),
        (C, 0, 0.95, Admit()),
        (S, 0, 1.0, Queue(CONFIG.max_wait_standard_s)),
        (C, 0, 1.0, Queue(CONFIG.max_wait_critical_s)),
        (S, 5, 1.0, Shed),  # standard may use half of the queue
        (C, 5, 1.0, Queue(CONFIG.max_wait_critical_s)),
        (C, 10, 1.0, Shed),
    ],
)
def test_admit_table(priority: Priority, depth: int, saturation: float, expected: object) -> None:
    result = admit(CONFIG, priority, depth, saturation)
    if expected is Shed:
        assert isinstance(result, Shed)
        assert result.reason
        assert result.retry_after > 0
    else:
        assert result == expected


def test_critical_waits_longest_and_sheddable_never_queues_by_default() -> None:
    config = AdmissionConfig()
    assert config.max_wait(C) > config.max_wait(S) > config.max_wait(X) == 0
    assert isinstance(admit(config, X, 0, 1.0), Shed)


def test_retry_after_grows_with_the_queue_and_is_capped() -> None:
    config = AdmissionConfig(queue_size=10, retry_after_s=2.0, max_retry_after_s=3.0)
    shallow = timed_out(config, 0)
    deep = timed_out(config, 10)
    assert shallow.reason == "queue_timeout"
    assert shallow.retry_after == 2.0
    assert deep.retry_after == 3.0


def test_wait_order_is_priority_then_arrival() -> None:
    arrivals = [(S, 0), (X, 1), (C, 2), (S, 3), (C, 4)]
    ordered = sorted(arrivals, key=lambda item: wait_order(*item))
    assert ordered == [(C, 2), (C, 4), (S, 0), (S, 3), (X, 1)]


def _w(wid: str, **fields: object) -> WorkerState:
    return WorkerState(id=wid, model="m", max_in_flight=10, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("workers", "low", "high"),
    [
        ((), 1.0, 1.0),
        ((_w("a", health=Health.EJECTED),), 1.0, 1.0),
        ((_w("a", in_flight=10), _w("b", in_flight=10)), 1.0, 1.0),
        ((_w("a"), _w("b")), 0.0, 0.0),
        ((_w("a", in_flight=5), _w("b", in_flight=0)), 0.25, 0.25),
        ((_w("a", in_flight=10), _w("b", in_flight=9)), 0.9, 0.999),
        ((_w("a", kv_usage=0.99), _w("b")), 0.5, 0.5),
    ],
)
def test_fleet_saturation(workers: tuple[WorkerState, ...], low: float, high: float) -> None:
    assert low <= fleet_saturation(FleetSnapshot(0.0, workers)) <= high


def test_saturation_is_one_only_when_no_worker_has_a_free_slot() -> None:
    kv_full = FleetSnapshot(0.0, (_w("a", kv_usage=0.99), _w("b", kv_usage=0.99)))
    assert fleet_saturation(kv_full) < 1.0
    assert isinstance(admit(CONFIG, S, 0, fleet_saturation(kv_full)), Admit)


# The queue shared between tenants (``share_room``): with CONFIG, 5 standard places.
FLOOD = {"a": [0, 5, 0]}  # tenant "a" holds every standard place


@pytest.mark.parametrize(
    ("tenant", "priority", "waiting", "expected"),
    [
        # The flood's own next request is refused, as on a one-tenant gateway.
        ("a", S, FLOOD, None),
        # Another tenant's takes the place of the flood's newest.
        ("b", S, FLOOD, ("a", S)),
        ("", S, FLOOD, ("a", S)),  # the credential-less are a tenant too
        # Two more than the newcomer's tenant holds: a place is given up.
        ("b", S, {"a": [0, 3, 0], "b": [0, 1, 0]}, ("a", S)),
        # One more would only trade places: refused.
        ("b", S, {"a": [0, 2, 0], "b": [0, 1, 0]}, None),
        ("b", S, {"a": [0, 3, 0], "b": [0, 2, 0]}, None),
        # The one holding the most gives up its place, ties to the smaller tag.
        ("c", S, {"a": [0, 2, 0], "b": [0, 3, 0]}, ("b", S)),
        ("c", S, {"b": [0, 3, 0], "a": [0, 3, 0]}, ("a", S)),
        # Its lowest priority first; never a waiter more important than the newcomer.
        ("b", S, {"a": [1, 4, 0]}, ("a", X)),
        ("b", S, {"a": [0, 0, 5]}, None),
        ("b", C, {"a": [0, 4, 6]}, ("a", S)),
        ("b", X, {"a": [0, 4, 6]}, None),
        # Only the room the newcomer competes for is counted, on both sides.
        ("b", S, {"a": [0, 3, 0], "b": [0, 0, 9]}, ("a", S)),
        # One tenant: nobody to displace.
        ("", S, {"": [0, 5, 0]}, None),
    ],
)
def test_a_full_queue_makes_room_for_a_tenant_holding_less(
    tenant: str,
    priority: Priority,
    waiting: dict[str, list[int]],
    expected: tuple[str, Priority] | None,
) -> None:
    assert share_room(priority, tenant, waiting) == expected
    depth = 10 if priority is C else 5
    verdict = admit(CONFIG, priority, depth, 1.0, tenant=tenant, waiting=waiting)
    if priority is X:
        assert isinstance(verdict, Shed) and verdict.reason == "sheddable_saturated"
    elif expected is None:
        assert isinstance(verdict, Shed) and verdict.reason == "queue_full"
    else:
        assert verdict == Queue(CONFIG.max_wait(priority), displaces=expected)


def test_without_tenants_a_full_queue_refuses_as_before() -> None:
    for waiting in (None, {}):
        verdict = admit(CONFIG, S, 5, 1.0, tenant="b", waiting=waiting)
        assert isinstance(verdict, Shed) and verdict.reason == "queue_full"
    assert admit(CONFIG, S, 4, 1.0, tenant="b", waiting=FLOOD) == Queue(CONFIG.max_wait_standard_s)
    late = displaced(CONFIG, 10)
    assert late.reason == QUEUE_SHARE and late.retry_after == timed_out(CONFIG, 10).retry_after
