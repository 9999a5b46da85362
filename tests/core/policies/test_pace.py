"""``Pace``: the arrival rate ``ttft`` counts the requests a placement delays by."""

from __future__ import annotations

import pytest

from kvgate.core.policies.pace import Pace


def test_the_pace_is_the_mean_gap_of_recent_arrivals_and_a_quiet_spell_lowers_it() -> None:
    pace = Pace(span=4)
    assert pace.rate(0.0) == 0.0  # nothing to measure yet
    for n in range(20):
        pace.note(n * 0.01)
    assert pace.rate(0.19) == pytest.approx(100.0)
    assert pace.rate(1.19) == pytest.approx(1.0)  # a second without arrivals
