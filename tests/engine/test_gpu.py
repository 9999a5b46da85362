import math

import pytest

from kvgate.engine.gpu import GpuThermal


def test_first_advance_only_sets_the_clock() -> None:
    t = GpuThermal(30.0, 80.0, 10.0)
    assert t.advance(1000.0, 1.0) == 30.0


def test_heats_toward_max_with_the_time_constant() -> None:
    t = GpuThermal(30.0, 80.0, 10.0)
    t.advance(0.0, 0.0)
    temp = t.advance(10.0, 1.0)
    assert temp == pytest.approx(80.0 - 50.0 * math.exp(-1.0))
    assert t.advance(1000.0, 1.0) == pytest.approx(80.0)


def test_cools_toward_idle_and_never_runs_backwards() -> None:
    t = GpuThermal(30.0, 80.0, 10.0)
    t.advance(0.0, 0.0)
    hot = t.advance(100.0, 1.0)
    assert t.advance(50.0, 0.0) == hot
    cooler = t.advance(110.0, 0.0)
    assert 30.0 < cooler < hot


def test_partial_utilisation_has_a_lower_steady_state() -> None:
    t = GpuThermal(30.0, 80.0, 1.0)
    t.advance(0.0, 0.0)
    assert t.advance(100.0, 0.5) == pytest.approx(55.0)
