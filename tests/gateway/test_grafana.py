"""The Grafana dashboard under deploy/grafana/ queries only metrics the gateway exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvgate.gateway.observe.metrics import GatewayMetrics, WorkerGaugeRow

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "kvgate.json"
_NAME = re.compile(r"\b(kvgate_[a-z0-9_]+)\b")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def exported() -> set[str]:
    """Every sample name the gateway's registry can expose (with its type's suffixes)."""
    row = WorkerGaugeRow("w", "m", "v", 0, "healthy", False)
    metrics = GatewayMetrics(lambda: [row])
    names: set[str] = set()
    for family in metrics.registry.collect():
        suffixes = _SUFFIXES.get(family.type, ("",))
        names.update(family.name + s for s in suffixes)
    return names


def queries(node: Any) -> Iterator[str]:
    """Every PromQL expression in the dashboard: panel targets and templating queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if (key in ("expr", "definition") and isinstance(value, str)) or (
                key == "query" and isinstance(value, str) and "kvgate_" in value
            ):
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


def test_every_query_names_a_metric_the_gateway_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    found = list(queries(dashboard))
    assert len(found) > 20
    known = exported()
    for expr in found:
        names = _NAME.findall(expr)
        assert names, f"no kvgate metric in {expr!r}"
        unknown = [n for n in names if n not in known]
        assert not unknown, f"{expr!r} names {unknown}, which the gateway does not export"


def test_every_per_worker_routing_signal_has_a_panel() -> None:
    text = DASHBOARD.read_text()
    worker_gauges = {n for n in exported() if n.startswith("kvgate_worker_")}
    missing = sorted(n for n in worker_gauges if n not in text)
    assert not missing, f"no panel shows {missing}"


def test_panels_are_laid_out_without_overlap() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        mine = {(g["x"] + i, g["y"] + j) for i in range(g["w"]) for j in range(g["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"
