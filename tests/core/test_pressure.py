"""Watermarks with hysteresis, temperature, migration plans and shedding, as tables."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from kvgate.core.fleet import FleetSnapshot, Health, Pressure, WorkerState
from kvgate.core.pressure import (
    MigrationCostModel,
    PressureConfig,
    PressureTracker,
    SessionLoad,
    fleet_pressure,
    plan_migrations,
    shed_rank,
    should_shed,
)
from kvgate.types import Priority

N, S, H = Pressure.NORMAL, Pressure.SOFT, Pressure.HARD


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([(0.5, N), (0.85, S), (0.84, S), (0.80, S), (0.79, N)], id="soft-margin"),
        pytest.param(
            [(0.96, H), (0.92, H), (0.90, H), (0.89, S), (0.81, S), (0.79, N)],
            id="hard-margin-then-soft-margin",
        ),
        pytest.param([(0.5, N), (0.97, H), (0.5, N)], id="jump-up-and-straight-down"),
        pytest.param([(0.86, S), (0.95, H), (0.949, H)], id="soft-to-hard"),
        pytest.param([(0.84, N), (0.849, N), (0.85, S)], id="threshold-is-inclusive"),
    ],
)
def test_watermark_hysteresis(steps: list[tuple[float, Pressure]]) -> None:
    tracker = PressureTracker()
    for t, (usage, level) in enumerate(steps):
        reading = tracker.update("w", float(t), kv_usage=usage)
        assert reading.level is level, f"step {t}: usage {usage}"
        assert reading.drain is False


@pytest.mark.parametrize(
    ("kv", "gpu", "level"),
    [
        pytest.param(0.5, 0.9, S, id="gpu-memory-higher"),
        pytest.param(0.96, 0.5, H, id="kv-higher"),
        pytest.param(None, 0.96, H, id="gpu-only"),
        pytest.param(0.2, None, N, id="kv-only"),
    ],
)
def test_signal_is_the_higher_of_kv_and_gpu(
    kv: float | None, gpu: float | None, level: Pressure
) -> None:
    assert PressureTracker().update("w", 0.0, kv_usage=kv, gpu_mem_usage=gpu).level is level


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(
            [(70, N, False), (83, S, False), (81, S, False), (79.9, N, False)],
            id="soft-limit-with-recovery",
        ),
        pytest.param(
            [(90, S, True), (88, S, True), (86.9, S, False), (80, S, False), (79, N, False)],
            id="drain-limit-with-recovery",
        ),
        pytest.param([(95, S, True), (60, N, False)], id="cooled-right-down"),
    ],
)
def test_temperature(steps: list[tuple[float, Pressure, bool]]) -> None:
    tracker = PressureTracker()
    for t, (temp, level, drain) in enumerate(steps):
        reading = tracker.update("w", float(t), kv_usage=0.3, gpu_temp_c=temp)
        assert (reading.level, reading.drain) == (level, drain), f"step {t}: {temp} °C"
    assert tracker.draining("w") is steps[-1][2]


def test_temperature_and_memory_combine_to_the_higher() -> None:
    tracker = PressureTracker()
    assert tracker.update("w", 0, kv_usage=0.97, gpu_temp_c=91).level is H
    reading = tracker.update("w", 1, kv_usage=0.5, gpu_temp_c=91)
    assert (reading.level, reading.drain) == (S, True)


@pytest.mark.parametrize(
    ("known", "expected"),
    [
        pytest.param(None, N, id="never-known-stays-normal"),
        pytest.param({"kv_usage": 0.9}, S, id="soft-kept"),
        pytest.param({"kv_usage": 0.97}, H, id="hard-kept"),
        pytest.param({"kv_usage": 0.3, "gpu_temp_c": 85.0}, S, id="heat-kept"),
    ],
)
def test_unknown_signals_keep_previous_level(
    known: dict[str, float] | None, expected: Pressure
) -> None:
    tracker = PressureTracker()
    if known is not None:
        tracker.update("w", 0.0, **known)
    reading = tracker.update("w", 1.0)
    assert (reading.level, reading.usage, reading.changed) == (expected, None, False)
    assert tracker.level("w") is expected


def test_changed_flag() -> None:
    tracker = PressureTracker()
    flags = [
        tracker.update("w", float(t), kv_usage=u).changed
        for t, u in enumerate([0.5, 0.9, 0.88, 0.7])
    ]
    assert flags == [False, True, False, True]


def test_time_above_watermarks() -> None:
    tracker = PressureTracker()
    tracker.update("w", 0.0, kv_usage=0.9)  # SOFT from 0
    tracker.update("w", 10.0, kv_usage=0.97)  # HARD from 10
    assert tracker.time_above("w", S, 12.0) == pytest.approx(12.0)
    assert tracker.time_above("w", H, 12.0) == pytest.approx(2.0)
    tracker.update("w", 15.0, kv_usage=0.5)  # NORMAL from 15
    assert tracker.time_above("w", S, 20.0) == pytest.approx(15.0)
    assert tracker.time_above("w", H, 20.0) == pytest.approx(5.0)
    assert tracker.time_above("w", N, 20.0) == 0.0
    assert tracker.time_above("unknown", S, 20.0) == 0.0


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"soft_watermark": 0.95, "hard_watermark": 0.9}, id="soft-above-hard"),
        pytest.param({"temp_soft_c": 90, "temp_drain_c": 85}, id="temp-soft-above-drain"),
        pytest.param({"soft_watermark": 1.5}, id="watermark-above-one"),
    ],
)
def test_config_rejects_nonsense(options: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        PressureConfig.model_validate(options)


# --- migration planning ---------------------------------------------------------

NOW = 1000.0


SOURCE = WorkerState(
    id="src",
    model="m",
    pressure=H,
    kv_usage=0.97,
    kv_capacity_tokens=100_000,
    waiting=4,
    running=8,
)
"""A HARD-pressured worker at 97% KV of 100k tokens, 4 waiting behind 8 running."""


def source(**overrides: Any) -> WorkerState:
    return replace(SOURCE, **overrides)


def target(name: str, **overrides: Any) -> WorkerState:
    base = WorkerState(
        id=name, model="m", kv_usage=0.3, kv_capacity_tokens=100_000, waiting=0, running=2
    )
    return replace(base, **overrides)


def fleet(*workers: WorkerState) -> FleetSnapshot:
    return FleetSnapshot(NOW, (source(), *workers))


# Needs 12k tokens moved (0.97 -> under 0.85): 2k + 5k + 8k does it; 10k stays.
SESSIONS = [
    SessionLoad("s8k", NOW - 5, 8000),
    SessionLoad("s2k", NOW - 5, 2000),
    SessionLoad("s10k", NOW - 5, 10000),
    SessionLoad("s5k", NOW - 5, 5000),
]


@pytest.mark.parametrize(
    ("worker", "sessions", "targets", "cost", "expected"),
    [
        pytest.param(
            source(),
            SESSIONS,
            [target("t1")],
            MigrationCostModel(),
            [("s2k", "t1"), ("s5k", "t1"), ("s8k", "t1")],
            id="smallest-first-stops-under-soft",
        ),
        pytest.param(
            source(),
            [SessionLoad("busy", NOW - 1, 13000), SessionLoad("idle", NOW - 600, 13000)],
            [target("t1")],
            MigrationCostModel(),
            [("idle", "t1")],
            id="idlest-first-on-equal-context",
        ),
        pytest.param(
            source(),
            SESSIONS,
            [target("t1")],
            # 1000 tok/s: 2k costs 2 s, 5k 5 s, 8k 8 s; gain falls from 9 s as usage drops.
            MigrationCostModel(prefill_tokens_per_s=1000),
            [("s2k", "t1"), ("s5k", "t1")],
            id="cost-beats-gain-stops-moving",
        ),
        pytest.param(
            source(),
            SESSIONS,
            [target("t1")],
            MigrationCostModel(prefill_tokens_per_s=100),
            [],
            id="too-expensive-to-move-anything",
        ),
        pytest.param(
            source(),
            [SessionLoad(s.session_key, s.last_active, s.context_tokens, 0.1) for s in SESSIONS],
            [target("t1")],
            # Recomputing would cost too much, but KV that moves with the session
            # (a llama.cpp slot saved and restored) costs 0.1 s: tier-aware planning.
            MigrationCostModel(prefill_tokens_per_s=100),
            [("s2k", "t1"), ("s5k", "t1"), ("s8k", "t1")],
            id="kv-moving-with-the-session-is-cheap",
        ),
        pytest.param(
            source(),
            SESSIONS,
            [
                target("busy", waiting=3),
                target("idle"),
                target("soft", pressure=S),
                target("ejected", health=Health.EJECTED),
                target("full", in_flight=256),
            ],
            MigrationCostModel(),
            [("s2k", "idle"), ("s5k", "idle"), ("s8k", "idle")],
            id="least-loaded-eligible-target",
        ),
        pytest.param(
            source(),
            SESSIONS,
            [target("a", in_flight=1), target("b", in_flight=1)],
            MigrationCostModel(),
            [("s2k", "a"), ("s5k", "b"), ("s8k", "a")],
            id="spread-across-equal-targets",
        ),
        pytest.param(
            source(),
            SESSIONS,
            [target("nearly-soft", kv_usage=0.82), target("roomy", kv_usage=0.5, in_flight=9)],
            MigrationCostModel(),
            [("s2k", "nearly-soft"), ("s5k", "roomy"), ("s8k", "roomy")],
            id="target-must-stay-under-soft",
        ),
        pytest.param(
            source(kv_capacity_tokens=None),
            [("a", NOW, 48500), ("b", NOW, 48500)],  # 97k tokens at 0.97: capacity 100k
            [target("t1", kv_capacity_tokens=200_000)],
            MigrationCostModel(prefill_tokens_per_s=1e9),
            [("a", "t1")],
            id="capacity-inferred-tuples-accepted",
        ),
        pytest.param(
            source(),
            SESSIONS,
            [target("soft", pressure=S), target("down", health=Health.EJECTED)],
            MigrationCostModel(),
            [],
            id="no-target",
        ),
        pytest.param(
            source(pressure=S, kv_usage=0.9),
            SESSIONS,
            [target("t1")],
            MigrationCostModel(),
            [],
            id="soft-is-not-migrated",
        ),
        pytest.param(
            source(kv_usage=None, gpu_mem_usage=None),
            SESSIONS,
            [target("t1")],
            MigrationCostModel(),
            [],
            id="unknown-usage",
        ),
    ],
)
def test_plan_migrations(
    worker: WorkerState,
    sessions: list[SessionLoad],
    targets: list[WorkerState],
    cost: MigrationCostModel,
    expected: list[tuple[str, str]],
) -> None:
    snapshot = FleetSnapshot(NOW, (worker, *targets))
    plan = plan_migrations(worker, sessions, snapshot, cost)
    assert [(m.session_key, m.to_worker) for m in plan] == expected
    for m in plan:
        assert (m.from_worker, m.reason) == ("src", "pressure_hard")
        assert m.expected_gain_s > m.cost_s > 0


def test_migration_gain_and_cost_figures() -> None:
    plan = plan_migrations(source(), [SessionLoad("s", NOW, 4000)], fleet(target("t1")))
    # queue 4 × 2 s / 8 running = 1 s; overshoot (0.97 − 0.85)/0.15 × 10 s = 8 s
    assert plan[0].expected_gain_s == pytest.approx(9.0)
    assert plan[0].cost_s == pytest.approx(0.5)


# --- shedding ---------------------------------------------------------------------


def shed_fleet(*levels: Pressure, extra: tuple[WorkerState, ...] = ()) -> FleetSnapshot:
    workers = tuple(WorkerState(id=f"w{i}", model="m", pressure=p) for i, p in enumerate(levels))
    return FleetSnapshot(0.0, workers + extra)


NEW, AFFINE = True, False
SHEDDABLE, STANDARD, CRITICAL = Priority.SHEDDABLE, Priority.STANDARD, Priority.CRITICAL


@pytest.mark.parametrize(
    ("snapshot", "verdicts"),
    [
        pytest.param(
            shed_fleet(N, H, H),
            {(SHEDDABLE, NEW): False, (SHEDDABLE, AFFINE): False},
            id="one-normal-worker-sheds-nothing",
        ),
        pytest.param(
            shed_fleet(S, H),
            {
                (SHEDDABLE, NEW): True,
                (STANDARD, NEW): True,
                (CRITICAL, NEW): False,
                (SHEDDABLE, AFFINE): False,
                (STANDARD, AFFINE): False,
            },
            id="all-soft-sheds-new-below-critical",
        ),
        pytest.param(
            shed_fleet(H, H),
            {
                (CRITICAL, NEW): True,
                (SHEDDABLE, AFFINE): True,
                (STANDARD, AFFINE): False,
                (CRITICAL, AFFINE): False,
            },
            id="all-hard-sheds-new-and-sheddable-affine",
        ),
        pytest.param(
            shed_fleet(S, extra=(WorkerState(id="out", model="m", health=Health.EJECTED),)),
            {(STANDARD, NEW): True},
            id="unroutable-normal-worker-does-not-count",
        ),
        pytest.param(shed_fleet(), {(SHEDDABLE, NEW): False}, id="empty-fleet-not-pressure"),
    ],
)
def test_should_shed(snapshot: FleetSnapshot, verdicts: dict[tuple[Priority, bool], bool]) -> None:
    got = {key: should_shed(key[0], key[1], snapshot) for key in verdicts}
    assert got == verdicts


@pytest.mark.parametrize(
    ("levels", "expected"),
    [([N, H], N), ([S, H], S), ([H, H], H), ([], N)],
)
def test_fleet_pressure(levels: list[Pressure], expected: Pressure) -> None:
    assert fleet_pressure(shed_fleet(*levels)) is expected


def test_shed_order_new_before_affine_then_low_priority() -> None:
    requests = [
        (CRITICAL, AFFINE),
        (SHEDDABLE, AFFINE),
        (CRITICAL, NEW),
        (STANDARD, NEW),
        (SHEDDABLE, NEW),
    ]
    assert sorted(requests, key=lambda r: shed_rank(*r)) == [
        (SHEDDABLE, NEW),
        (STANDARD, NEW),
        (CRITICAL, NEW),
        (SHEDDABLE, AFFINE),
        (CRITICAL, AFFINE),
    ]
