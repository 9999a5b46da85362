"""The records that go in and out of an engine: requests, step results, offload results."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvgate.types import BlockHash, Seconds


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation request as the engine sees it: a block-hash chain and token counts.

    ``block_hashes`` are chained hashes of the prompt's blocks (block i's hash covers
    blocks 0..i), e.g. from ``blocks.chain_hashes`` or a trace's ``hash_ids``. Only
    the first ``prompt_tokens // block_size`` are used: the partially filled last
    block is never shared. ``output_block_hashes`` optionally continue the chain
    over the output (the block straddling prompt and output first) when the caller
    decides the output up front, as the emulated worker does; the engine then
    caches those blocks when the request finishes, so a session's next turn can hit
    them as it would in vLLM.
    """

    request_id: str
    block_hashes: Sequence[BlockHash]
    prompt_tokens: int
    max_tokens: int
    session_id: str | None = None
    output_block_hashes: Sequence[BlockHash] = ()


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request that produced all its tokens; times are the driver's clock, in seconds."""

    request_id: str
    session_id: str | None
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    arrival: Seconds
    first_token_time: Seconds
    finish_time: Seconds
    preemptions: int = 0

    @property
    def ttft(self) -> Seconds:
        """Time to first token: queue wait plus prefill of the uncached tokens."""
        return self.first_token_time - self.arrival

    @property
    def e2e(self) -> Seconds:
        """End-to-end latency, arrival to last token."""
        return self.finish_time - self.arrival


@dataclass(slots=True)
class StepResult:
    """What one call of ``Engine.step`` did.

    ``steps`` is how many scheduler iterations were fused into this result (1 unless
    ``horizon`` allowed consecutive decode-only steps to be fused). ``first_tokens``
    lists ``(request_id, cached_tokens)`` for requests whose prefill completed;
    ``tokens`` maps each request to the tokens it produced (the first token included).
    """

    duration: Seconds = 0.0
    first_tokens: list[tuple[str, int]] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    finished: list[FinishedRequest] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    steps: int = 0
    prefill_tokens: int = 0
    restored_blocks: int = 0


@dataclass(frozen=True, slots=True)
class OffloadResult:
    """What ``Engine.offload`` did with the blocks it was asked to move off the GPU.

    ``offloaded`` went to the CPU or disk tier, ``dropped`` were freed with nowhere
    to go (no offload capacity), ``in_use`` stayed because running requests hold
    them, ``not_resident`` were not on the GPU. ``transfer_seconds`` is the copy time
    the offload costs (device to host); it does not stall the engine. ``copied`` went to a
    tier and stayed on the GPU too (``Engine.offload(copy=True)``).
    """

    offloaded: int = 0
    dropped: int = 0
    in_use: int = 0
    not_resident: int = 0
    transfer_seconds: Seconds = 0.0
    copied: int = 0

    @property
    def freed(self) -> int:
        """GPU blocks this call freed."""
        return self.offloaded + self.dropped
