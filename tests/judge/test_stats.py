"""The paired intervals, against values worked out by hand, and the verdicts they give."""

from __future__ import annotations

import math

import pytest

from kvgate.judge.stats import (
    LOSS,
    MET,
    OPEN,
    Estimate,
    at_least,
    at_most,
    mean_interval,
    paired_points,
    paired_ratio,
    t975,
    within,
)


def test_t_quantiles_are_the_tables_and_the_large_sample_limit() -> None:
    assert t975(1) == 12.706
    assert t975(7) == 2.365  # eight seeds
    assert t975(60) == pytest.approx(2.000, abs=0.001)
    assert t975(10_000) == pytest.approx(1.960, abs=0.001)
    with pytest.raises(ValueError):
        t975(0)


def test_mean_interval_by_hand() -> None:
    # mean 2.5, sd sqrt(5/3) = 1.290994, se 0.645497, t(3) 3.182: half-width 2.053972.
    e = mean_interval([1.0, 2.0, 3.0, 4.0])
    assert e.value == 2.5 and e.n == 4
    assert e.low == pytest.approx(0.446028, abs=1e-6)
    assert e.high == pytest.approx(4.553972, abs=1e-6)
    one = mean_interval([3.0])
    assert one.low is None and one.high is None and one.value == 3.0


def test_paired_ratio_is_a_geometric_mean_with_a_t_interval_on_logs() -> None:
    # Ratios 2, 2, 4: logs mean (4/3) ln 2, sd ln2 / sqrt 3, se ln2 / 3, t(2) 4.303.
    e = paired_ratio([2.0, 4.0, 8.0], [1.0, 2.0, 2.0])
    assert e.value == pytest.approx(2 ** (4 / 3))
    half = 4.303 * math.log(2) / 3
    assert e.low == pytest.approx(math.exp(4 / 3 * math.log(2) - half))
    assert e.high == pytest.approx(math.exp(4 / 3 * math.log(2) + half))
    assert e.low == pytest.approx(0.932386, abs=1e-6)
    assert e.high == pytest.approx(6.810056, abs=1e-6)
    # A pair without a positive value has no log ratio: it is left out.
    assert paired_ratio([2.0, 0.0], [1.0, 1.0]).n == 1
    with pytest.raises(ValueError):
        paired_ratio([0.0], [1.0])


INF = math.inf


def test_an_unbounded_percentile_of_the_judged_router_loses_the_bar() -> None:
    # Faster on seven seeds, but on one its p99 fell on refused requests: unbounded.
    e = paired_ratio([0.5] * 7 + [INF], [1.0] * 8)
    assert (e.value, e.low, e.high, e.n) == (INF, INF, INF, 8)
    assert at_most(e, 1.05) == LOSS
    # Even a single seed decides: an unbounded figure is no noise for more seeds to average.
    assert at_most(paired_ratio([INF], [1.0]), 1.05) == LOSS


def test_a_peers_unbounded_percentile_is_its_value() -> None:
    # The peer refused on one seed: on that seed the judged router is infinitely faster.
    e = paired_ratio([2.0, 2.0, 1.0], [1.0, 1.0, INF])
    assert (e.value, e.low, e.high, e.n) == (0.0, 0.0, 0.0, 3)
    assert at_most(e, 1.05) == MET


def test_seeds_unbounded_for_both_say_nothing_and_each_side_once_leaves_it_open() -> None:
    both = paired_ratio([2.0, 4.0, 8.0, INF], [1.0, 2.0, 2.0, INF])
    assert both == paired_ratio([2.0, 4.0, 8.0], [1.0, 2.0, 2.0])  # the pair left out
    with pytest.raises(ValueError):
        paired_ratio([INF], [INF])
    mixed = paired_ratio([INF, 1.0, 1.0], [1.0, INF, 1.0])
    assert (mixed.low, mixed.high) == (0.0, INF)
    assert at_most(mixed, 1.05) == OPEN
    assert paired_ratio([INF, INF, 1.0], [1.0, 1.0, INF]).value == INF  # more seeds lost


def test_paired_points_by_hand() -> None:
    # Differences -1 and +2 points: mean 0.5, sd 2.12132, se 1.5, t(1) 12.706.
    e = paired_points([0.80, 0.82], [0.81, 0.80])
    assert e.value == pytest.approx(0.5)
    assert e.low == pytest.approx(0.5 - 12.706 * 1.5)
    assert e.high == pytest.approx(0.5 + 12.706 * 1.5)


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [(0.90, 1.04, MET), (1.00, 1.10, OPEN), (1.06, 1.20, LOSS), (1.05, 1.05, MET)],
)
def test_a_ratio_bar_is_lost_only_where_the_whole_interval_is_past_it(
    low: float, high: float, expected: str
) -> None:
    assert at_most(Estimate(1.0, low, high, 8), 1.05) == expected


def test_difference_and_band_bars() -> None:
    assert at_least(Estimate(-0.4, -0.9, 0.2, 8), -1.0) == MET
    assert at_least(Estimate(-1.0, -1.5, -0.5, 8), -1.0) == OPEN
    assert at_least(Estimate(-2.0, -2.5, -1.5, 8), -1.0) == LOSS
    assert within(Estimate(1.0, 0.9, 1.1, 8), 0.8, 1.2) == MET
    assert within(Estimate(1.2, 1.1, 1.3, 8), 0.8, 1.2) == OPEN
    assert within(Estimate(1.3, 1.25, 1.35, 8), 0.8, 1.2) == LOSS
    assert within(Estimate(0.5, 0.4, 0.6, 8), 0.8, 1.2) == LOSS
    # One seed gives no interval: never a verdict.
    assert at_most(Estimate(9.0, None, None, 1), 1.05) == OPEN
