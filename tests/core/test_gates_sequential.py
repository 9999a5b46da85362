"""The error gate fails early when the errors prove its bound broken, and rarely otherwise."""

from __future__ import annotations

import random

import pytest

from kvgate.core.gates import Gates, Verdict, evaluate_gates, wilson_lower
from kvgate.core.window import WindowStats

GATES = Gates(max_error_rate=0.01, min_samples=20, latency_p99=None, ttft_p99=None)


def _error_gate(requests: int, errors: int) -> Verdict:
    stats = WindowStats(0.0, 1.0, requests=requests, errors=errors)
    (result,) = evaluate_gates(GATES, stats, None, None)
    assert result.name == "error_rate"
    return result.verdict


@pytest.mark.parametrize(
    ("requests", "errors", "verdict"),
    [
        (13, 0, Verdict.INCONCLUSIVE),  # too few, nothing proven
        (4, 2, Verdict.INCONCLUSIVE),  # two errors are not enough to act on early
        (6, 3, Verdict.FAIL),  # half failing: proven broken well before min_samples
        (13, 7, Verdict.FAIL),
        (19, 1, Verdict.INCONCLUSIVE),
        (20, 0, Verdict.PASS),
        (20, 1, Verdict.FAIL),  # min_samples reached: the observed rate is judged
    ],
)
def test_error_gate_verdicts(requests: int, errors: int, verdict: Verdict) -> None:
    assert _error_gate(requests, errors) is verdict


def test_wilson_lower_bound() -> None:
    assert wilson_lower(0, 10, 0.95) == 0.0
    assert wilson_lower(3, 3, 0.95) == pytest.approx(0.5258, abs=1e-3)
    assert wilson_lower(50, 100, 0.95) < 0.5 < 0.5 + 1e-9


def _first_failure(rng: random.Random, rate: float, horizon: int) -> int | None:
    errors = 0
    for n in range(1, horizon + 1):
        errors += rng.random() < rate
        stats = WindowStats(0.0, 1.0, requests=n, errors=errors)
        if n < GATES.min_samples and evaluate_gates(GATES, stats, None, None)[0].verdict is (
            Verdict.FAIL
        ):
            return n
    return None


def test_a_failing_canary_fails_within_a_handful_of_requests() -> None:
    rng = random.Random(7)
    firsts = [_first_failure(rng, 0.5, 19) for _ in range(200)]
    assert all(n is not None for n in firsts)
    assert sorted(n for n in firsts if n is not None)[100] <= 8


def test_a_canary_within_its_bound_is_rarely_failed_early() -> None:
    # Early failure only (below min_samples), looked at after every request.
    rng = random.Random(11)
    early = sum(_first_failure(rng, 0.005, 19) is not None for _ in range(2000))
    assert early / 2000 < 0.002
