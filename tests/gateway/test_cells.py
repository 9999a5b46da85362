"""Metric cells give the same exposition as ``prometheus_client``'s own ``inc``/``observe``."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from kvgate.gateway.observe.cells import CellCache, CounterCell, HistogramCell

_BOUNDS = (0.001, 0.01, 0.1, 1.0, 10.0)


def _pair() -> tuple[CollectorRegistry, Counter, Histogram]:
    r = CollectorRegistry()
    c = Counter("kvgate_x_total", "x", ["w"], registry=r)
    h = Histogram("kvgate_y_seconds", "y", ["w"], buckets=_BOUNDS, registry=r)
    return r, c, h


def _samples(registry: CollectorRegistry) -> list[bytes]:
    """The exposition's lines but ``*_created`` (the time each series was made)."""
    return [line for line in generate_latest(registry).splitlines() if b"_created" not in line]


def test_same_exposition_as_the_library() -> None:
    rng = random.Random(7)
    amounts = [0.0, -0.5, *_BOUNDS, math.inf, math.nan, 1e-9, 11.0]
    amounts += [rng.choice((0.0001, 0.5, 3.0)) * rng.random() for _ in range(500)]
    theirs, c1, h1 = _pair()
    ours, c2, h2 = _pair()
    counter, histogram = CounterCell(c2.labels("a")), HistogramCell(h2.labels("a"))
    for amount in amounts:
        h1.labels("a").observe(amount)
        histogram.observe(amount)
        if amount >= 0 and not math.isnan(amount):
            c1.labels("a").inc(amount)
            counter.inc(amount)
    assert _samples(ours) == _samples(theirs)


def test_a_negative_count_is_refused() -> None:
    _, c, _ = _pair()
    cell = CounterCell(c.labels("a"))
    with pytest.raises(ValueError):
        cell.inc(-1)
    cell.inc()
    assert c.labels("a")._value.get() == 1.0


def test_the_cache_hands_out_one_cell_per_series_and_stays_bounded() -> None:
    _, c, h = _pair()
    cache = CellCache(limit=3)
    assert cache.counter(c, "a") is cache.counter(c, "a")
    assert cache.histogram(h, "a") is cache.histogram(h, "a")
    for name in ("b", "c", "d", "e"):
        cache.counter(c, name).inc()
    assert len(cache._counters) <= 3
    assert c.labels("e")._value.get() == 1.0
