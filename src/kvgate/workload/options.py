"""What the commands that run workloads share: ``--workload``/``--trace`` and their results.

``kvgate sim``, ``kvgate bench`` and ``kvgate demo`` declare these once, here,
so that the live commands need nothing from the simulator.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from kvgate.workload.synthetic import WORKLOADS, SyntheticWorkload, Workload, build_workload
from kvgate.workload.traces import MooncakeTrace, RagPulseTrace, open_trace

WorkloadOption = Annotated[
    str | None,
    typer.Option(
        help=f"Synthetic workload: {', '.join(WORKLOADS)} [NAME:key=value,...; vary=0.5 jitters "
        "the options left at their defaults by the seed]"
    ),
]
"""``--workload``, shared by ``kvgate sim`` and ``kvgate bench``."""

TraceOption = Annotated[
    Path | None,
    typer.Option(help="Trace to replay: a Mooncake JSONL file or the RAGPulse folder"),
]
"""``--trace``, shared by ``kvgate sim`` and ``kvgate bench``."""


WorkloadFactory = Callable[[Mapping[str, object]], Workload]
"""Builds the workload for one sweep point from workload-level overrides."""

RATE_PARAMS = ("rate", "rate_scale")
"""Options a trace can be swept over (it has no others)."""


def workload_factory(
    *, workload: str | None, trace: str | None, seed: int, rate_scale: float
) -> WorkloadFactory:
    """A factory for ``--workload NAME[:opts]`` or ``--trace FILE`` (exactly one)."""
    if (workload is None) == (trace is None):
        raise ValueError("give exactly one of a workload name or a trace file")
    if trace is not None:
        path = trace
        open_trace(path, rate_scale)  # fail early on a bad path

        def make_trace(overrides: Mapping[str, object]) -> Workload:
            scale = rate_scale
            for key, value in overrides.items():
                if key not in RATE_PARAMS:
                    raise ValueError(f"a trace has no option {key!r}; sweep rate or rate_scale")
                scale = float(str(value)) if key == "rate_scale" else scale * float(str(value))
            loaded: MooncakeTrace | RagPulseTrace = open_trace(path, scale)
            return loaded

        return make_trace
    spec = workload or ""
    build_workload(spec, seed, rate_scale)  # fail early on a bad name or option

    def make_synthetic(overrides: Mapping[str, object]) -> Workload:
        scale = rate_scale
        options = dict(overrides)
        if "rate_scale" in options:
            scale = float(str(options.pop("rate_scale")))
        built: SyntheticWorkload = build_workload(spec, seed, scale, options)
        return built

    return make_synthetic


def write_results(path: Path, results: Mapping[str, Any]) -> None:
    """Write ``results`` as stable, indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n", encoding="utf-8")
