"""``kvgate.bench.epp``: the picker benchmark runs end to end and its figures add up."""

from __future__ import annotations

import pytest

from kvgate.bench.epp import run


@pytest.mark.timeout(240)
def test_the_picker_benchmark_measures_both_data_planes() -> None:
    result = run(requests=100, concurrency=4, sequential=20)
    assert result.errors == 0
    assert result.picker_cpu_ms_per_request > 0 and result.proxy_cpu_ms_per_request > 0
    assert result.decisions_per_cpu_second == pytest.approx(
        1000 / result.picker_cpu_ms_per_decision
    )
    assert 0 < result.decision_p50_ms <= result.decision_p99_ms
    assert "decisions per CPU-second" in result.table()
