"""``EngineConfig``: the knobs of one engine, with values derived from its profile."""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.engine.profiles import MIB, LatencyProfile, get_profile


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Configuration of one engine (vLLM's names where they exist).

    Fields left at ``0`` are derived from the latency profile in ``__post_init__``,
    so after construction every field holds a concrete value: ``num_gpu_blocks`` is
    what fits in ``gpu_memory_utilization`` of the device after the weights,
    ``kv_bytes_per_block`` is the profile's KV bytes per token times ``block_size``.

    ``preemption=True`` is vLLM's recompute preemption: when a running request
    cannot get a block for its next token, the most recently arrived running
    request is preempted. With ``preemption=False`` a request is admitted only
    when blocks for its whole prompt and ``max_tokens`` are free, and keeps them
    reserved, so nothing ever needs preempting.
    """

    block_size: int = 16
    num_gpu_blocks: int = 0
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    preemption: bool = True
    cpu_offload_blocks: int = 0
    disk_offload_blocks: int = 0
    cpu_bandwidth_gb_s: float = 25.0  # host <-> device over PCIe Gen5 x16, effective
    disk_bandwidth_gb_s: float = 3.0  # a datacenter NVMe drive, sequential
    offload_on_evict: bool = False
    profile: str = "h100-llama3-8b"
    gpu_memory_utilization: float = 0.9
    gpu_total_mib: float = 0.0
    weights_mib: float = 0.0
    kv_bytes_per_block: int = 0
    idle_temp_c: float = 0.0
    max_temp_c: float = 0.0
    thermal_time_constant_s: float = 0.0
    max_tracked_sessions: int = 65_536

    def __post_init__(self) -> None:
        prof = get_profile(self.profile)
        for name in ("block_size", "max_num_seqs", "max_batched_tokens", "max_tracked_sessions"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1")
        for name in ("num_gpu_blocks", "cpu_offload_blocks", "disk_offload_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"EngineConfig.{name} must be >= 0")
        if self.cpu_bandwidth_gb_s <= 0 or self.disk_bandwidth_gb_s <= 0:
            raise ValueError("EngineConfig offload bandwidths must be > 0")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("EngineConfig.gpu_memory_utilization must be in (0, 1]")
        derived = {
            "gpu_total_mib": prof.gpu_total_mib,
            "weights_mib": prof.weights_mib,
            "kv_bytes_per_block": prof.kv_bytes_per_token * self.block_size,
            "idle_temp_c": prof.idle_temp_c,
            "max_temp_c": prof.max_temp_c,
            "thermal_time_constant_s": prof.thermal_time_constant_s,
        }
        for name, value in derived.items():
            if not getattr(self, name):
                object.__setattr__(self, name, value)
        if not self.num_gpu_blocks:
            kv_mib = self.gpu_total_mib * self.gpu_memory_utilization - self.weights_mib
            blocks = int(kv_mib * MIB // self.kv_bytes_per_block)
            if blocks < 1:
                raise ValueError("the model's weights leave no memory for the KV cache")
            object.__setattr__(self, "num_gpu_blocks", blocks)

    @property
    def latency(self) -> LatencyProfile:
        """The latency profile named by ``profile``."""
        return get_profile(self.profile)

    @property
    def kv_capacity_tokens(self) -> int:
        """How many tokens of KV cache the GPU holds."""
        return self.num_gpu_blocks * self.block_size
