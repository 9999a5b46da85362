"""A worker's routed state and the one function that snapshots it (``core.routed``)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest

from kvgate.core.fleet import Health, Pressure
from kvgate.core.pressure import PressureConfig
from kvgate.core.routed import Routed, Scraped, reloaded, state_bounds, worker_state

READINGS = Scraped(
    running=2,
    waiting=1,
    kv_usage=0.4,
    kv_capacity_tokens=1000,
    gpu_temp_c=60.0,
    gpu_mem_used_mib=40.0,
    gpu_mem_total_mib=80.0,
)
FULL = Routed(
    id="w",
    model="m",
    version="v2",
    max_in_flight=8,
    labels=(("zone", "a"),),
    probe_ok=True,
    ejected=False,
    draining=False,
    pressure=Pressure.SOFT,
    in_flight=3,
    kv_in_flight_tokens=50,
    signals=READINGS,
    signals_at=100.0,
)


def test_loaded_changes_only_the_accounting() -> None:
    assert FULL.loaded(0, 0) == FULL  # every other field carried over, in its place
    more = FULL.loaded(1, 25)
    assert (more.in_flight, more.kv_in_flight_tokens) == (4, 75)
    assert more.loaded(-1, -500).kv_in_flight_tokens == 0  # never negative
    assert more == replace(FULL, in_flight=4, kv_in_flight_tokens=75)
    assert hash(more) == hash(replace(FULL, in_flight=4, kv_in_flight_tokens=75))
    with pytest.raises(FrozenInstanceError):
        more.in_flight = 0  # type: ignore[misc]
    assert FULL.in_flight == 3  # the value it was made from is untouched


def test_kv_freed_since_the_scrape_counts_releases_until_the_next_scrape() -> None:
    # The scrape still counts the KV of requests that ended after it was read.
    released = FULL.loaded(1, 200).loaded(-1, -120).loaded(-1, -30)
    assert (released.kv_in_flight_tokens, released.kv_freed_tokens) == (100, 150)
    assert worker_state(released, 101.0, 3.0).kv_freed_tokens == 150
    rescraped = released.scraped(READINGS, 102.0)
    assert (rescraped.kv_freed_tokens, rescraped.signals_at) == (0, 102.0)
    assert rescraped.kv_in_flight_tokens == 100


def test_fresh_readings_show_and_stale_ones_are_unknown() -> None:
    fresh = worker_state(FULL, 101.0, 3.0)
    assert (fresh.health, fresh.running, fresh.kv_usage, fresh.gpu_mem_usage) == (
        Health.HEALTHY,
        2,
        0.4,
        0.5,
    )
    stale = worker_state(FULL, 110.0, 3.0)
    assert (stale.health, stale.running, stale.kv_usage) == (Health.DEGRADED, None, None)
    assert stale.kv_capacity_tokens == 1000  # configuration, not a reading
    assert state_bounds(FULL, 101.0, 3.0) == (float("-inf"), 103.0)
    assert state_bounds(FULL, 104.0, 3.0) == (103.0, float("inf"))


def test_health_inputs_and_the_kv_estimate_raise_what_policies_see() -> None:
    assert worker_state(Routed(id="w", model="m"), 0.0, 3.0).health is Health.EJECTED
    draining = Routed(id="w", model="m", probe_ok=True, draining=True)
    assert worker_state(draining, 0.0, 3.0).health is Health.DRAINING
    calm = Routed(id="w", model="m", probe_ok=True, signals=READINGS, signals_at=0.0)
    filling = calm.loaded(1, 900)
    assert worker_state(filling, 0.0, 3.0).pressure is Pressure.NORMAL  # pressure off
    assert worker_state(filling, 0.0, 3.0, PressureConfig()).pressure is Pressure.SOFT


@pytest.mark.parametrize(
    "base",
    [
        FULL,
        replace(FULL, pressure=Pressure.NORMAL, kv_in_flight_tokens=0),
        replace(FULL, draining=True),
        replace(FULL, probe_ok=False),
        replace(FULL, signals=None),
    ],
)
@pytest.mark.parametrize("now", [101.0, 110.0])  # fresh, then stale signals
@pytest.mark.parametrize("pressure", [None, PressureConfig()])
def test_reloaded_is_worker_state_of_the_loaded_value(
    base: Routed, now: float, pressure: PressureConfig | None
) -> None:
    state = worker_state(base, 101.0, 3.0, pressure)
    for requests, kv in [(1, 0), (1, 700), (-1, -700), (-3, -50), (2, 20)]:
        loaded = base.loaded(requests, kv)
        assert reloaded(state, loaded, now, 3.0, pressure) == worker_state(
            loaded, now, 3.0, pressure
        )


def test_no_enum_member_is_a_class_default() -> None:
    # A class attribute of a mutable type (an Enum member) keeps CPython 3.11 from
    # specializing reads of the instance's field by that name (``RequestFeatures``' too).
    assert "pressure" not in vars(Routed)
    assert Routed(id="w").pressure is Pressure.NORMAL
    assert Routed(id="w").loaded(1, 10).pressure is Pressure.NORMAL
