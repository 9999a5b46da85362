"""Experiments: several policies on one workload, optionally swept over a parameter.

Every policy sees the same requests (the workload is replayed from the start for
each) on a fresh fleet with the same seed, and the infinite-cache bound is
computed once per workload, beside the capacity-aware reference (the fleet's
total KV as one LRU cache). A sweep repeats that for each value of one
parameter: a fleet setting (``workers``, ``kv_blocks``, ``scrape_interval``...),
an admission limit, the arrival rate, a workload option, or a policy option
(given to every policy that has it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.core.admission import AdmissionConfig
from kvgate.core.policies import default_registry
from kvgate.sim.kvfeed import split_policy
from kvgate.sim.simulation import Progress, RunResult, SimConfig, Simulation
from kvgate.workload.bound import Bound, capacity_reference, infinite_cache_bound
from kvgate.workload.options import RATE_PARAMS, WorkloadFactory
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.synthetic import workload_options

_FLEET_PARAMS = {
    "workers": int,
    "kv_blocks": int,
    "block_size": int,
    "max_num_seqs": int,
    "max_batched_tokens": int,
    "scrape_interval": float,
    "affinity_ttl": float,
    "seed": int,
}


def fleet_kv_blocks(config: SimConfig) -> int:
    """The whole fleet's KV cache in engine blocks: the capacity-aware reference's size."""
    return sum(config.engine_config(i).num_gpu_blocks for i in range(config.workers))


@dataclass(frozen=True)
class PointResult:
    """All policies at one sweep point (or the only point of a plain comparison)."""

    value: object
    workload: dict[str, Any]
    bound: Bound
    runs: list[RunResult]
    reference: Bound | None = None


@dataclass
class Experiment:
    """Policies to compare, the fleet, the workload, and an optional sweep."""

    make_workload: WorkloadFactory
    policies: Sequence[str]
    config: SimConfig
    policy_options: Mapping[str, object] = field(default_factory=dict)
    sweep_param: str | None = None
    sweep_values: Sequence[str] = ()
    misses: bool = False
    """Follow where each run's cache misses went (``workload.misses``) into its summary."""
    as_peers: frozenset[str] = frozenset()
    """Policies run as a peer router runs them: without the gateway's memory-pressure
    handling and KV gate (``SimConfig.pressure`` None). sglang-router, smg and
    vllm-router have neither, and queue what kvgate would hold or shed, so a policy
    modelling one of them is compared as it runs live (``benchmarks/peers.py``)."""

    def __post_init__(self) -> None:
        registry = default_registry()
        for name in self.policies:
            registry[split_policy(name)[0]]  # an unknown name fails here, before any run
        if not self.as_peers <= set(self.policies):
            unknown = ", ".join(sorted(self.as_peers - set(self.policies)))
            raise ValueError(f"run as peers but not among the policies: {unknown}")
        if self.sweep_param is not None and not self.sweep_values:
            raise ValueError("a sweep needs at least one value")

    def _options_for(self, policy: str, extra: Mapping[str, object]) -> dict[str, Any]:
        fields = default_registry()[split_policy(policy)[0]].config.model_fields
        merged = {**self.policy_options, **extra}
        return {k: v for k, v in merged.items() if k in fields}

    def _point(self, value: str | None) -> tuple[SimConfig, dict[str, object], dict[str, object]]:
        """The fleet config, workload overrides and policy options of one sweep point."""
        config = self.config
        param = self.sweep_param
        if param is None or value is None:
            return config, {}, {}
        if param in _FLEET_PARAMS:
            number = _FLEET_PARAMS[param](value)
            if param == "kv_blocks":
                return dataclasses.replace(config, kv_blocks=(int(number),)), {}, {}
            return dataclasses.replace(config, **{param: number}), {}, {}
        if param in AdmissionConfig.model_fields:
            admission = config.admission.model_copy(update={param: float(value)})
            admission = AdmissionConfig.model_validate(admission.model_dump())
            return dataclasses.replace(config, admission=admission), {}, {}
        if param in RATE_PARAMS:
            return config, {param: value}, {}
        probe = self.make_workload({})
        if param in workload_options(probe.name):
            return config, {param: value}, {}
        registry = default_registry()
        if any(param in registry[split_policy(p)[0]].config.model_fields for p in self.policies):
            return config, {}, {param: value}
        raise ValueError(
            f"cannot sweep {param!r}: not a fleet setting, admission limit, workload option "
            "or option of any chosen policy"
        )

    def check(self) -> None:
        """Validate every sweep point's settings before spending time on runs."""
        values: Sequence[str | None] = list(self.sweep_values) or [None]
        for value in values:
            self._point(value)

    def run(self, progress: Callable[[str, int], Progress] | None = None) -> list[PointResult]:
        """Every sweep point, every policy; ``progress(label, total)`` gives a per-run callback."""
        points: list[PointResult] = []
        values: Sequence[str | None] = list(self.sweep_values) if self.sweep_param else [None]
        for value in values:
            config, overrides, extra = self._point(value)
            workload = self.make_workload(overrides)
            codec = PromptCodec(config.block_size, config.features, model=config.model)
            bound = infinite_cache_bound(config.limited(workload.requests()), codec)
            reference = capacity_reference(
                config.limited(workload.requests()), codec, fleet_kv_blocks(config)
            )
            runs: list[RunResult] = []
            for policy in self.policies:
                label = policy if value is None else f"{policy} {self.sweep_param}={value}"
                options = self._options_for(policy, extra)
                fleet = config
                if policy in self.as_peers:
                    fleet = dataclasses.replace(config, pressure=None)
                sim = Simulation(
                    fleet, workload.requests(), policy, options, codec, misses=self.misses
                )
                result = sim.run(progress(label, bound.requests) if progress is not None else None)
                result.summary["hit_rate_of_bound"] = (
                    round(result.summary["hit_rate"] / bound.hit_rate, 6)
                    if bound.hit_rate
                    else None
                )
                result.summary["hit_rate_of_reference"] = (
                    round(result.summary["hit_rate"] / reference.hit_rate, 6)
                    if reference.hit_rate
                    else None
                )
                if policy in self.as_peers:
                    result.summary["as_peer"] = True
                runs.append(result)
            shown: object = value
            if value is not None:
                try:
                    shown = float(value) if "." in value or "e" in value.lower() else int(value)
                except ValueError:
                    shown = value
            points.append(PointResult(shown, workload.describe(), bound, runs, reference))
        return points
