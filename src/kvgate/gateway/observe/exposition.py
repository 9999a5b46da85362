"""How the gateway's metrics reach Prometheus: the collectors read at scrape time, and the page.

``observe.metrics`` declares every metric (names, help, labels, what each value is read
from); this module holds the machinery that turns those declarations into families
when Prometheus scrapes (nothing here names a metric) and renders the text exposition,
with or without the ``*_created`` series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

Row = TypeVar("Row")
Item = TypeVar("Item")

RowGauge = tuple[str, str, str | None, Callable[[Row], float | Mapping[str, float] | None]]
"""One per-row gauge: name, help, the extra label (``None``: none), the row's value.

With an extra label the value is a mapping (label value -> sample); a ``None`` value
(an unknown reading) leaves the sample out, never zero."""


def maybe(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    """Add a sample only for a known reading: an unknown one is absent, never zero."""
    if value is not None:
        family.add_metric(labels, float(value))


class RowCollector(Collector, Generic[Row]):
    """Gauges with one sample per row (a worker, ...), the rows read when Prometheus scrapes."""

    def __init__(
        self,
        rows: Callable[[], Iterable[Row]],
        labels: Callable[[Row], list[str]],
        label_names: Sequence[str],
        gauges: Sequence[RowGauge[Row]],
    ) -> None:
        self._rows = rows
        self._labels = labels
        self._label_names = list(label_names)
        self._gauges = gauges

    def describe(self) -> Iterator[Metric]:
        """The families ``collect`` yields, without reading the rows."""
        return iter(self._families())

    def _families(self) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(name, text, labels=[*self._label_names, *([extra] if extra else [])])
            for name, text, extra, _ in self._gauges
        ]

    def collect(self) -> Iterator[Metric]:
        """Every family, one sample per row (or per row and label value)."""
        families = self._families()
        for row in self._rows():
            labels = self._labels(row)
            for family, (_, _, _, value) in zip(families, self._gauges, strict=True):
                found = value(row)
                if isinstance(found, Mapping):
                    for label, sample in found.items():
                        family.add_metric([*labels, label], sample)
                else:
                    maybe(family, labels, found)
        yield from families


class ValueCollector(Collector):
    """Unlabelled counters and gauges whose values are read when Prometheus scrapes."""

    def __init__(self, readings: Callable[[], Sequence[tuple[str, str, str, float]]]) -> None:
        self._readings = readings

    def collect(self) -> Iterator[Metric]:
        """One family per reading: (kind, name, help, value)."""
        for kind, name, text, value in self._readings():
            if kind == "counter":
                yield CounterMetricFamily(name, text, value=value)
            else:
                yield GaugeMetricFamily(name, text, value=value)


class KeyedCollector(Collector, Generic[Item]):
    """Gauges with one sample per key of a mapping read when Prometheus scrapes."""

    def __init__(
        self,
        read: Callable[[], Mapping[str, Item]],
        label: str,
        gauges: Sequence[tuple[str, str, Callable[[Item], float | None]]],
    ) -> None:
        self._read = read
        self._label = label
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        """Every family, one sample per key (unknown values left out)."""
        found = self._read()
        for name, text, value in self._gauges:
            family = GaugeMetricFamily(name, text, labels=[self._label])
            for key, item in found.items():
                maybe(family, [key], value(item))
            yield family


class _WithoutCreated:
    """A registry's view without the ``*_created`` samples (``render(created=False)``).

    prometheus_client's ``disable_created_metrics()`` is process-wide; this keeps
    the choice per registry, so one gateway's setting cannot change another's.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            if family.type in ("counter", "histogram", "summary", "gaugehistogram"):
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


def render(registry: CollectorRegistry, *, created: bool) -> bytes:
    """The text exposition of ``registry`` (``*_created`` series only when ``created``)."""
    if created:
        return generate_latest(registry)
    return generate_latest(_WithoutCreated(registry))
