"""Outlier ejection (Envoy rules) and fall/rise health tracking, as event tables."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvgate.core.outlier import (
    Blame,
    HealthCheckConfig,
    HealthTracker,
    OutlierConfig,
    OutlierDetector,
    Transition,
    blame,
)


@dataclass(frozen=True)
class Event:
    """One driver call and what it should return / leave behind.

    ``kind`` is ``fail``, ``ok`` (live success) or ``probe``; ``returns`` is the
    call's return value (``None`` for ``ok``); ``ejected`` is ``is_ejected`` right
    after the call.
    """

    at: float
    kind: str
    returns: bool | None
    ejected: bool


def _run(detector: OutlierDetector, worker: str, events: list[Event]) -> None:
    for step, e in enumerate(events):
        if e.kind == "fail":
            got: bool | None = detector.record_failure(worker, e.at)
        elif e.kind == "ok":
            detector.record_success(worker, e.at)
            got = None
        else:
            got = detector.probe_succeeded(worker, e.at)
        assert got == e.returns, f"step {step}: {e}"
        assert detector.is_ejected(worker, e.at) == e.ejected, f"step {step}: {e}"


def _fails(start: float, n: int, *, last_ejects: bool) -> list[Event]:
    """``n`` failures one second apart; only the last may eject."""
    events = [Event(start + i, "fail", False, False) for i in range(n - 1)]
    events.append(Event(start + n - 1, "fail", last_ejects, last_ejects))
    return events


FLEET = [f"w{i}" for i in range(10)]


@pytest.mark.parametrize(
    "events",
    [
        pytest.param(_fails(0, 5, last_ejects=True), id="five-in-a-row-eject"),
        pytest.param(
            [
                *_fails(0, 4, last_ejects=False)[:4],
                Event(4, "ok", None, False),
                *_fails(5, 4, last_ejects=False),
            ],
            id="success-resets-streak",
        ),
        pytest.param(
            [
                *_fails(0, 5, last_ejects=True),
                Event(10, "fail", False, True),  # stragglers do not extend it
                Event(33.9, "ok", None, True),
                Event(34, "ok", None, False),  # 30 s after ejection at t=4
            ],
            id="back-after-base-time",
        ),
        pytest.param(
            [
                *_fails(0, 5, last_ejects=True),
                *_fails(34, 5, last_ejects=True),  # second ejection at t=38 lasts 60 s
                Event(97.9, "ok", None, True),
                Event(98, "ok", None, False),
            ],
            id="second-ejection-doubles",
        ),
        pytest.param(
            [
                *_fails(0, 5, last_ejects=True),
                Event(10, "probe", False, True),  # out only 6 s < 10 s floor
                Event(14, "probe", True, False),  # 10 s out: a passing probe readmits
            ],
            id="probe-readmits-after-floor",
        ),
        pytest.param(
            [Event(0, "probe", False, False), *_fails(1, 5, last_ejects=True)],
            id="probe-when-in-service-is-noop",
        ),
    ],
)
def test_ejection_sequences(events: list[Event]) -> None:
    detector = OutlierDetector()
    detector.set_workers(FLEET)
    _run(detector, "w0", events)


def test_ejection_time_is_capped() -> None:
    detector = OutlierDetector(OutlierConfig(consecutive_failures=1, max_ejection_s=300))
    detector.set_workers(FLEET)
    durations = []
    now = 0.0
    for _ in range(12):
        assert detector.record_failure("w0", now)
        until = detector.ejected_until("w0", now)
        assert until is not None
        durations.append(until - now)
        now = until  # fail again the moment it is back
    assert durations[:3] == [30, 60, 90]
    assert max(durations) == 300
    assert detector.ejection_count("w0") == 12


def test_multiplier_decays_while_in_service() -> None:
    detector = OutlierDetector(OutlierConfig(consecutive_failures=1))
    detector.set_workers(FLEET)
    assert detector.record_failure("w0", 0)  # 30 s, back at 30
    assert detector.record_failure("w0", 30)  # 60 s, back at 90
    # 600 s (two max_ejection_s) in service: multiplier 2 -> 0, next is base again.
    assert detector.record_failure("w0", 690)
    assert detector.ejected_until("w0", 690) == 720
    assert detector.ejection_count("w0") == 3


@pytest.mark.parametrize(
    ("fleet", "fraction", "always_one", "expected_ejected"),
    [
        pytest.param(1, 0.1, True, 0, id="never-the-only-worker"),
        pytest.param(2, 0.1, True, 1, id="one-of-two-always"),
        pytest.param(5, 0.1, True, 1, id="one-of-five"),
        pytest.param(5, 0.1, False, 0, id="strict-share-ejects-none-under-ten"),
        pytest.param(10, 0.1, True, 1, id="ten-percent-of-ten"),
        pytest.param(20, 0.1, True, 2, id="ten-percent-of-twenty"),
        pytest.param(10, 0.5, True, 5, id="half"),
    ],
)
def test_share_cap(fleet: int, fraction: float, always_one: bool, expected_ejected: int) -> None:
    detector = OutlierDetector(
        OutlierConfig(
            consecutive_failures=1, max_ejected_fraction=fraction, always_eject_one=always_one
        )
    )
    workers = [f"w{i}" for i in range(fleet)]
    detector.set_workers(workers)
    newly = [detector.record_failure(w, 1.0) for w in workers]
    assert sum(newly) == expected_ejected
    assert len(detector.ejected(1.0)) == expected_ejected


def test_refused_ejection_retries_when_room_appears() -> None:
    detector = OutlierDetector(OutlierConfig(consecutive_failures=2))
    detector.set_workers(["a", "b", "c"])
    for t in (0, 1):
        detector.record_failure("a", t)
    assert detector.is_ejected("a", 1)
    assert not detector.record_failure("b", 2)
    assert not detector.record_failure("b", 3)  # streak reached, but no room
    assert not detector.is_ejected("b", 3)
    assert detector.record_failure("b", 31)  # "a" came back at 31: room again
    assert detector.ejected(31) == frozenset({"b"})


def test_set_workers_forgets_removed() -> None:
    detector = OutlierDetector(OutlierConfig(consecutive_failures=1))
    detector.set_workers(["a", "b"])
    assert detector.record_failure("a", 0)
    detector.set_workers(["b", "c"])
    assert (detector.is_ejected("a", 1), detector.ejection_count("a")) == (False, 0)


UP, DOWN = Transition.UP, Transition.DOWN


@pytest.mark.parametrize(
    ("probes", "transitions", "healthy_after"),
    [
        pytest.param([True, True], [None, None], True, id="starts-healthy"),
        pytest.param([False, False], [None, None], True, id="two-fails-not-enough"),
        pytest.param([False, False, False], [None, None, DOWN], False, id="fall-3"),
        pytest.param([False, False, True, False, False], [None] * 5, True, id="pass-resets-fall"),
        pytest.param(
            [False, False, False, True, True], [None, None, DOWN, None, UP], True, id="rise-2"
        ),
        pytest.param(
            [False, False, False, True, False, True],
            [None, None, DOWN, None, None, None],
            False,
            id="fail-resets-rise",
        ),
    ],
)
def test_fall_rise(
    probes: list[bool], transitions: list[Transition | None], healthy_after: bool
) -> None:
    tracker = HealthTracker()
    got = [tracker.record_probe("w", ok, float(t)) for t, ok in enumerate(probes)]
    assert got == transitions
    assert tracker.is_healthy("w") is healthy_after


def test_initially_unhealthy_needs_rise() -> None:
    tracker = HealthTracker(HealthCheckConfig(initially_healthy=False, rise=2))
    assert not tracker.is_healthy("w")
    assert tracker.record_probe("w", True, 0) is None
    assert tracker.record_probe("w", True, 2) is UP
    assert tracker.since("w") == 2


@pytest.mark.parametrize(
    ("statuses", "served", "expected"),
    [
        pytest.param([500], True, Blame.WORKER, id="another-worker-served"),
        pytest.param([500, 503], True, Blame.WORKER, id="two-failed-then-served"),
        pytest.param([500, 500], False, Blame.REQUEST, id="same-error-twice"),
        pytest.param([502, 500, 500], False, Blame.REQUEST, id="same-error-repeated-later"),
        pytest.param([500], False, Blame.UNKNOWN, id="no-second-opinion"),
        pytest.param([500, 502], False, Blame.WORKER, id="different-errors"),
    ],
)
def test_blame(statuses: list[int], served: bool, expected: Blame) -> None:
    assert blame(statuses, served=served) is expected


def test_share_cap_counts_each_pool() -> None:
    """A fleet of two models: each model's pool may lose one worker, not the fleet one."""
    detector = OutlierDetector(OutlierConfig(consecutive_failures=1))
    pools = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
    detector.set_workers(pools, pools)
    assert detector.record_failure("a1", 0)
    assert detector.record_failure("b1", 0)  # the fleet cap would have refused this one
    assert not detector.record_failure("a2", 0)  # a's last worker in service
    assert detector.ejected(0) == frozenset({"a1", "b1"})


@pytest.mark.parametrize("fraction", [0.1, 1.0])
def test_a_models_last_worker_is_never_ejected(fraction: float) -> None:
    detector = OutlierDetector(OutlierConfig(consecutive_failures=1, max_ejected_fraction=fraction))
    pools = {"a1": "a", "a2": "a", "solo": "s"}
    detector.set_workers(pools, pools)
    assert not any(detector.record_failure("solo", t) for t in range(10))
    assert detector.record_failure("a1", 0)
    assert not detector.record_failure("a2", 1)
    assert detector.ejected(1) == frozenset({"a1"})
