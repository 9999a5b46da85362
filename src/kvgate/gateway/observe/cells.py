"""The request path's handles on labelled metric series: one call per observation.

A request updates about ten series (requests, duration, time to first token,
tokens, the routing decision). Through ``prometheus_client`` each ``inc`` is
five Python calls (the observability check twice, the counter, its value, the
lock's enter and exit) and each ``observe`` twice that: some forty calls a
request, about as many as the routing decision itself makes. A cell holds the
series' value objects and updates them itself: the same numbers in the same
``Counter`` and ``Histogram`` (``/metrics`` renders them as before).

In a single process the values are ``MutexValue``s and a cell adds to their
float without the lock: every request-path update runs on the one event-loop
thread, and the scrape thread only reads (a float read is atomic under the
GIL). Any other value class (multiprocess mode's memory-mapped files) is
updated through its own ``inc``.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.values import MutexValue


class CounterCell:
    """One labelled counter series: ``inc`` as ``Counter.inc`` (no exemplars)."""

    __slots__ = ("_direct", "_value")

    def __init__(self, child: Counter) -> None:
        self._value: Any = child._value
        self._direct = type(self._value) is MutexValue

    def inc(self, amount: float = 1) -> None:
        """Add ``amount`` (``ValueError`` when negative, as ``Counter.inc``)."""
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        if self._direct:
            self._value._value += amount
        else:
            self._value.inc(amount)


class HistogramCell:
    """One labelled histogram series: ``observe`` as ``Histogram.observe`` (no exemplars)."""

    __slots__ = ("_bounds", "_buckets", "_direct", "_sum")

    def __init__(self, child: Histogram) -> None:
        self._bounds: list[float] = list(child._upper_bounds)
        self._buckets: list[Any] = list(child._buckets)
        self._sum: Any = child._sum
        self._direct = type(self._sum) is MutexValue and all(
            type(b) is MutexValue for b in self._buckets
        )

    def observe(self, amount: float) -> None:
        """Count ``amount`` in the first bucket whose bound is at least it, and in the sum."""
        # bisect_left finds the first bound >= amount, as Histogram.observe's scan does;
        # a NaN matches no bound there (bisect says 0) and is only summed here too.
        i = bisect_left(self._bounds, amount)
        counted = i or amount <= self._bounds[0]
        if self._direct:
            self._sum._value += amount
            if counted:
                self._buckets[i]._value += 1
            return
        self._sum.inc(amount)
        if counted:
            self._buckets[i].inc(1)


class CellCache:
    """Cells by series, made on first use.

    ``labels()`` validates, joins and locks on every call (microseconds). The label
    values on the request path come from config and the fleet (models, versions,
    workers, codes, reasons), so the cache stays small; ``limit`` bounds it anyway.
    """

    def __init__(self, limit: int) -> None:
        self._counters: dict[tuple[Counter, tuple[str, ...]], CounterCell] = {}
        self._histograms: dict[tuple[Histogram, tuple[str, ...]], HistogramCell] = {}
        self._limit = limit

    def counter(self, metric: Counter, *values: str) -> CounterCell:
        """The cell of ``metric.labels(*values)``: the request path's way to count."""
        cells = self._counters
        found = cells.get((metric, values))
        if found is None:
            if len(cells) >= self._limit:
                cells.clear()  # made-up label values must not grow it without bound
            found = cells[metric, values] = CounterCell(metric.labels(*values))
        return found

    def histogram(self, metric: Histogram, *values: str) -> HistogramCell:
        """The cell of ``metric.labels(*values)``: the request path's way to observe."""
        cells = self._histograms
        found = cells.get((metric, values))
        if found is None:
            if len(cells) >= self._limit:
                cells.clear()
            found = cells[metric, values] = HistogramCell(metric.labels(*values))
        return found
