"""``Worker``: the state one emulated worker's handlers share.

One instance per app (never module-level), so several workers run side by side
in one process.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from aiohttp import web

from kvgate.engine import Engine, EngineRequest
from kvgate.engine.blocks import chain_hashes
from kvgate.engine.config import EngineConfig
from kvgate.workersim.driver import EngineDriver
from kvgate.workersim.faults import FaultInjector, FaultSettings, FaultUpdate
from kvgate.workersim.kvpublish import EnginePublisher
from kvgate.workersim.metrics import WorkerCollector, build_registry
from kvgate.workersim.options import WorkerOptions
from kvgate.workersim.protocol import ApiError, Prompt
from kvgate.workersim.responses import filler_tokens
from kvgate.workersim.slottable import SlotTable


def engine_config(options: WorkerOptions) -> EngineConfig:
    """The engine configuration ``options`` describe; unset sizes come from the profile."""
    overrides: dict[str, Any] = {}
    if options.kv_blocks is not None:
        overrides["num_gpu_blocks"] = options.kv_blocks
    if options.max_num_seqs is not None:
        overrides["max_num_seqs"] = options.max_num_seqs
    if options.max_batched_tokens is not None:
        overrides["max_batched_tokens"] = options.max_batched_tokens
    return EngineConfig(
        block_size=options.block_size,
        enable_prefix_caching=options.enable_prefix_caching,
        cpu_offload_blocks=options.cpu_offload_blocks,
        disk_offload_blocks=options.disk_offload_blocks,
        profile=options.profile,
        **overrides,
    )


class Worker:
    """The engine, its driver, the faults and the counters of one emulated worker."""

    def __init__(self, options: WorkerOptions, engine: Engine | None = None) -> None:
        self.options = options
        self.config = engine_config(options)
        self.engine = engine if engine is not None else Engine(self.config)
        capacity = self.config.kv_capacity_tokens
        self.context_limit = min(options.max_model_len or capacity, capacity)
        self.driver = EngineDriver(
            self.engine, options.time_scale, horizon_s=options.step_horizon_ms / 1000.0
        )
        self.faults = FaultInjector(
            FaultSettings(
                error_rate=options.error_rate,
                extra_latency_ms=options.extra_latency_ms,
                speed=options.speed,
            ),
            seed=options.seed,
        )
        self.engine.set_speed(options.speed)
        # A device's identity, not part of the model: random unless configured.
        self.gpu_uuid = options.gpu_uuid or f"GPU-{uuid.uuid4()}"
        self.finished: Counter[str] = Counter()
        self.registry = build_registry(
            WorkerCollector(
                options,
                self.driver,
                self.faults,
                self.config,
                self.finished,
                gpu_uuid=self.gpu_uuid,
            )
        )
        self.slot_table = (
            SlotTable(
                options.slots,
                self.engine,
                model=options.model,
                save_path=Path(options.slot_save_path) if options.slot_save_path else None,
            )
            if options.slots
            else None
        )
        """llama.cpp's slots, when the worker emulates a llama.cpp server."""
        self.kv_publisher: EnginePublisher | None = None
        """Set when the app publishes KV events (``workersim.kvpublish``)."""
        self._rng = random.Random(options.seed)
        self._next_id = 0
        self._id_stem = self.gpu_uuid[4:12]

    def set_faults(self, update: FaultUpdate) -> FaultSettings:
        """Apply a partial fault update (``POST /admin/faults``); the engine takes its speed."""
        settings = self.faults.update(update)
        self.engine.set_speed(settings.speed)
        return settings

    @property
    def requests_started(self) -> int:
        """Requests given an id so far (llama.cpp's ``id_task`` of a slot's request)."""
        return self._next_id

    def new_request_id(self, prefix: str) -> str:
        """A request id unique to this worker, OpenAI-styled (``chatcmpl-...``)."""
        self._next_id += 1
        return f"{prefix}-{self._id_stem}{self._next_id:08x}"

    def check_model(self, model: str) -> None:
        """``ApiError(404)`` for a model this worker does not serve, as vLLM answers."""
        if self.options.strict_model and model != self.options.model:
            raise ApiError(
                404,
                f"The model `{model}` does not exist.",
                type_="NotFoundError",
                code="model_not_found",
                param="model",
            )

    def output_budget(self, requested: int | None, prompt_tokens: int) -> tuple[int, str]:
        """How many tokens to generate and the finish reason once they are out.

        A client's ``max_tokens`` ends in ``length``; otherwise the length is drawn
        from a seeded exponential (the model "chose" to stop) and ends in ``stop``.
        """
        limit = self.context_limit
        if prompt_tokens >= limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your "
                f"prompt has {prompt_tokens} tokens.",
                code="context_length_exceeded",
                param="messages",
            )
        if requested is not None:
            if prompt_tokens + requested > limit:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {limit} tokens. However, you "
                    f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the "
                    f"prompt, {requested} in the completion).",
                    code="context_length_exceeded",
                    param="max_tokens",
                )
            return requested, "length"
        drawn = round(self._rng.expovariate(1.0 / self.options.output_tokens_mean))
        return max(1, min(drawn, self.options.output_tokens_max, limit - prompt_tokens)), "stop"

    def engine_request(
        self,
        request_id: str,
        prompt: Prompt,
        max_tokens: int,
        session_id: str | None,
    ) -> EngineRequest:
        """The engine's view of one request: its prompt's (and output's) block hashes.

        The output is decided up front, so its blocks are hashed too: the engine
        caches them when the request finishes, and the next turn of a chat, which
        repeats the answer in its prompt, hits them as it would in vLLM.
        """
        block_size = self.options.block_size
        tokens = prompt.tokens
        output = filler_tokens(max_tokens, prompt.text) if prompt.text is not None else None
        if output is None:
            # Token-id prompts, or an output that would merge with the prompt's last word.
            hashes, output_hashes = chain_hashes(tokens, block_size), []
        else:
            full = chain_hashes(tokens + output, block_size)
            split = len(tokens) // block_size
            hashes, output_hashes = full[:split], full[split:]
        if self.kv_publisher is not None:
            self.kv_publisher.tokens.note(
                tokens if output is None else tokens + output, hashes + output_hashes, block_size
            )
        return EngineRequest(
            request_id=request_id,
            block_hashes=hashes,
            prompt_tokens=len(tokens),
            max_tokens=max_tokens,
            session_id=session_id,
            output_block_hashes=output_hashes,
        )

    @staticmethod
    def created() -> int:
        """The ``created`` timestamp of a response (wall clock, as OpenAI reports)."""
        return int(time.time())


WORKER_KEY = web.AppKey("kvgate.workersim.worker", Worker)
"""Where the app keeps its ``Worker``."""
