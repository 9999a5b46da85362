"""Admission: admit, queue or shed by priority, queue depth and fleet saturation."""

from __future__ import annotations

import pytest

from kvgate.core.admission import (
    AdmissionConfig,
    Admit,
    Queue,
    Shed,
    admit,
    fleet_saturation,
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
