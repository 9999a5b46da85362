"""``WorkerOptions``: everything one emulated worker is configured with."""

from __future__ import annotations

import socket

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvgate.engine.profiles import PROFILES


class WorkerOptions(BaseModel):
    """Configuration of one emulated worker (``kvgate worker-sim``).

    The engine fields (``profile``, ``kv_blocks``, ...) size the modelled GPU; the
    fault fields are the initial fault settings, changeable at run time through
    ``POST /admin/faults``. ``port=0`` binds a free port (tests).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    model: str = "demo"
    version: str = "v1"
    strict_model: bool = Field(
        default=True,
        description="Answer 404 for a model name other than ours, as vLLM does.",
    )

    # The modelled engine.
    profile: str = "h100-llama3-8b"
    kv_blocks: int | None = Field(
        default=None,
        ge=1,
        description="GPU KV-cache blocks; by default what the profile's GPU holds.",
    )
    block_size: int = Field(default=16, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_batched_tokens: int | None = Field(default=None, ge=1)
    cpu_offload_blocks: int = Field(default=0, ge=0)
    disk_offload_blocks: int = Field(default=0, ge=0)
    enable_prefix_caching: bool = True
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        description="Longest prompt + output accepted; defaults to what the KV cache holds.",
    )

    # Real-time driving.
    time_scale: float = Field(default=1.0, gt=0.0, description="Model seconds per real second.")
    step_horizon_ms: float = Field(
        default=2.0,
        ge=0.0,
        description=(
            "Real milliseconds of decode-only steps the engine may fuse into one; "
            "bounds event-loop wake-ups at large time scales."
        ),
    )
    seed: int = 0
    output_tokens_mean: int = Field(
        default=128, ge=1, description="Mean output length when a request sets no max_tokens."
    )
    output_tokens_max: int = Field(default=2048, ge=1)

    # llama.cpp's slot API (``workersim.slotapi``).
    slots: int = Field(
        default=0,
        ge=0,
        description=(
            "Serve as a llama.cpp server with this many slots: id_slot, GET /slots and "
            "slot save/restore/erase, one prompt's KV per slot (0: a vLLM-like worker)."
        ),
    )
    slot_save_path: str | None = Field(
        default=None, description="Folder of saved slots (llama.cpp's --slot-save-path)."
    )

    # KV events (``workersim.kvpublish``), in vLLM's format.
    kv_events_port: int | None = Field(
        default=None,
        ge=0,
        le=65534,
        description=(
            "Publish KV events (vLLM's ZeroMQ format) on this port, replay on the next "
            "one (None: no events)."
        ),
    )

    # Request routing hints.
    session_header: str = "X-Session-ID"

    # Faults at start-up (see ``faults.FaultSettings``).
    error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    extra_latency_ms: float = Field(default=0.0, ge=0.0)
    speed: float = Field(
        default=1.0, gt=0.0, le=100.0, description="The engine's speed as a share of its profile's."
    )

    # What the DCGM exporter series are labelled with.
    gpu_index: int = Field(default=0, ge=0)
    gpu_name: str = "NVIDIA H100 80GB HBM3"
    gpu_uuid: str | None = Field(default=None, description="Default: a fresh random UUID.")
    hostname: str = Field(default_factory=socket.gethostname)

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, name: str) -> str:
        if name not in PROFILES:
            raise ValueError(f"unknown engine profile {name!r}; known: {', '.join(PROFILES)}")
        return name
