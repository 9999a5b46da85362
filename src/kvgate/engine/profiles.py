"""Latency profiles: how long one engine step takes on a given GPU and model.

A step computes a batch: ``duration = step_base_s + prefill_tokens / prefill_tokens_per_s
+ decode_seqs * decode_per_seq_s + context_tokens * attention_per_ctx_token_s``.
Only uncached prompt tokens are computed; blocks restored from an offload tier cost
their transfer time instead (added by the engine). The profile also carries the
memory and thermal figures of the device, so the GPU model can be derived from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class LatencyProfile:
    """The cost model of one (device, model) pair; see the module docstring for the formula."""

    name: str
    prefill_tokens_per_s: float
    step_base_s: float
    decode_per_seq_s: float
    attention_per_ctx_token_s: float
    gpu_total_mib: float
    weights_mib: float
    kv_bytes_per_token: int
    idle_temp_c: float = 32.0
    max_temp_c: float = 78.0
    thermal_time_constant_s: float = 60.0
    description: str = ""

    def scaled(self, speed: float) -> LatencyProfile:
        """This profile running at ``speed`` times its rate (0.5: every step takes twice
        as long, as a throttled GPU or a noisy neighbour makes it); memory is unchanged."""
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        if speed == 1.0:
            return self
        return replace(
            self,
            prefill_tokens_per_s=self.prefill_tokens_per_s * speed,
            step_base_s=self.step_base_s / speed,
            decode_per_seq_s=self.decode_per_seq_s / speed,
            attention_per_ctx_token_s=self.attention_per_ctx_token_s / speed,
        )

    def step_time(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """Model seconds of one step computing ``prefill_tokens`` and ``decode_seqs`` tokens."""
        return (
            self.step_base_s
            + prefill_tokens / self.prefill_tokens_per_s
            + decode_seqs * self.decode_per_seq_s
            + context_tokens * self.attention_per_ctx_token_s
        )


# Llama-3-8B: 32 layers x 8 KV heads x 128 head dim x 2 (K and V) x 2 bytes (fp16)
# = 131,072 bytes (128 KiB) of KV cache per token; 8.03e9 parameters x 2 bytes
# = 16.06 GB = 15,317 MiB of weights.
_LLAMA3_8B_KV = 32 * 8 * 128 * 2 * 2
_LLAMA3_8B_WEIGHTS_MIB = 15_317.0

H100_LLAMA3_8B = LatencyProfile(
    name="h100-llama3-8b",
    # vLLM and SGLang published throughput runs of Llama-3-8B on one H100 SXM
    # (bf16, chunked prefill) sustain roughly 10-15k prompt tokens/s.
    prefill_tokens_per_s=12_000.0,
    # A decode step reads all weights once: 16 GB / 3.35 TB/s HBM3 = 4.8 ms, plus
    # scheduler, sampling and launch overhead -> ~7 ms at batch 1 (vLLM reports
    # ~7-8 ms inter-token latency for a single Llama-3-8B stream on H100).
    step_base_s=0.007,
    decode_per_seq_s=0.00008,
    # Attention reads each context token's KV (128 KiB) once per step:
    # 131,072 B / 3.35 TB/s = 39 ns.
    attention_per_ctx_token_s=3.9e-8,
    gpu_total_mib=81_559.0,  # nvidia-smi total of an H100 80GB
    weights_mib=_LLAMA3_8B_WEIGHTS_MIB,
    kv_bytes_per_token=_LLAMA3_8B_KV,
    idle_temp_c=33.0,
    max_temp_c=76.0,
    thermal_time_constant_s=45.0,
    description="Llama-3-8B fp16 on one H100 80GB SXM (vLLM-like)",
)

A100_LLAMA3_8B = LatencyProfile(
    name="a100-llama3-8b",
    # A100 has ~1/3 of H100's dense bf16 FLOPs but runs prefill at higher MFU;
    # published vLLM runs of 8B models reach ~6-7k prompt tokens/s.
    prefill_tokens_per_s=6_500.0,
    # 16 GB / 2.04 TB/s HBM2e = 7.9 ms weight read, plus overhead.
    step_base_s=0.0105,
    decode_per_seq_s=0.00012,
    attention_per_ctx_token_s=6.4e-8,  # 131,072 B / 2.04 TB/s
    gpu_total_mib=81_920.0,
    weights_mib=_LLAMA3_8B_WEIGHTS_MIB,
    kv_bytes_per_token=_LLAMA3_8B_KV,
    idle_temp_c=34.0,
    max_temp_c=80.0,
    thermal_time_constant_s=45.0,
    description="Llama-3-8B fp16 on one A100 80GB SXM (vLLM-like)",
)

CPU_SMALL = LatencyProfile(
    name="cpu-small",
    prefill_tokens_per_s=167.0,
    step_base_s=0.025,
    decode_per_seq_s=0.021,
    attention_per_ctx_token_s=1.4e-6,
    gpu_total_mib=2_048.0,  # the RAM budget given to the process
    weights_mib=512.0,  # 268M parameters x 2 bytes
    # 18 layers x 1 KV head x 256 head dim x 2 x 2 bytes = 18 KiB per token.
    kv_bytes_per_token=18 * 1 * 256 * 2 * 2,
    idle_temp_c=45.0,
    max_temp_c=85.0,
    thermal_time_constant_s=20.0,
    description="Gemma 3 270M Q4_K_M in llama.cpp, 1 CPU thread (one worker per core)",
)
"""Gemma 3 270M (Q4_K_M GGUF) in llama.cpp (``xllamacpp``) on one CPU thread: how
kvgate's real workers run in tests, ``kvgate demo --real-workers`` and
``benchmarks/real_engine.py`` (two workers on a 2-core machine).

Measured, not guessed: ``benchmarks/calibrate_llamacpp.py --threads 1,2 --repeats 3``
on the 2-core build machine (load average ~2, i.e. another job on the other core,
as a second worker would be). Parameters come from the best run of each
measurement (other load only ever slows a run down): cold prefill 167 prompt
tokens/s (medians 144-154); a decode step at batch 1 of 46 ms with a short
context (median 51 ms), 21 ms more for a second stream, 1.4 us more per context
token. Step time = 0.025 + prefill / 167 + 0.021 per stream + 1.4e-6 per context
token.

Noise, for scale: an earlier run on an idle machine with 2 threads reached
~250 tokens/s (once ~500) and ~25 ms steps; the same script under a load
average of ~10 measured 1 thread at 65 tokens/s and ~90 ms steps, and 2 threads
at load ~5 were slower than 1 (two spinning threads on two busy cores).
Real runs on a busy machine fall behind this profile accordingly."""

FAST = LatencyProfile(
    name="fast",
    prefill_tokens_per_s=1_000_000.0,
    step_base_s=0.0001,
    decode_per_seq_s=0.000001,
    attention_per_ctx_token_s=0.0,
    gpu_total_mib=1_024.0,
    weights_mib=512.0,
    kv_bytes_per_token=4_096,
    idle_temp_c=30.0,
    max_temp_c=70.0,
    thermal_time_constant_s=1.0,
    description="tiny step times, for tests",
)

PROFILES: Mapping[str, LatencyProfile] = MappingProxyType(
    {p.name: p for p in (H100_LLAMA3_8B, A100_LLAMA3_8B, CPU_SMALL, FAST)}
)
"""Every named profile, by name."""


def get_profile(name: str) -> LatencyProfile:
    """The profile called ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown engine profile {name!r}; known: {known}") from None
