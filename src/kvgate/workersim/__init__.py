"""An emulated OpenAI-compatible worker that runs kvgate's engine model in real time.

For tests, demos and benchmarks: it answers like vLLM (same endpoints, response
shapes, metric names) but its latencies, KV cache and batching come from
``kvgate.engine``, stepped against the event loop's clock scaled by
``time_scale``.

Endpoints:

- ``POST /v1/chat/completions``, ``POST /v1/completions``: OpenAI's API, streamed
  (SSE ending ``data: [DONE]``) or not. Output is filler text of ``max_tokens``
  (or ``max_completion_tokens``) tokens, or of a seeded random length when unset.
  ``usage.prompt_tokens_details.cached_tokens`` is the engine's prefix-cache hit.
  The header ``X-Session-ID`` (``WorkerOptions.session_header``), else the
  ``user`` field, names the request's session in the engine.
- ``GET /v1/models``: the served model; ``kvgate_version`` holds its version.
- ``GET /health``: 200 while the engine runs.
- ``GET /metrics``: Prometheus text with vLLM's (``vllm:*``) and NVIDIA DCGM
  exporter's (``DCGM_FI_DEV_*``) names and labels.
- ``POST /kv/offload``: move KV blocks to the offload tier (``engine.offload``).
  Body: ``{"session_ids": [...], "prompts": [...], "block_hashes": [...]}``, each
  optional. A prompt is a text (hashed as ``/v1/completions`` would) or a list of
  chat messages (hashed as ``/v1/chat/completions`` would); its prefix blocks are
  offloaded. Answers ``requested_blocks``, ``sessions`` and the engine's
  ``OffloadResult`` counts.
- ``GET /admin/faults``, ``POST /admin/faults``: read or change injected faults
  (see ``kvgate.workersim.faults``).

In-process use::

    async with running_worker(WorkerOptions(port=0, profile="fast", time_scale=100)) as w:
        client = AsyncOpenAI(base_url=w.url + "/v1", api_key="unused")
"""

from kvgate.workersim.app import create_app
from kvgate.workersim.faults import FaultSettings
from kvgate.workersim.options import WorkerOptions
from kvgate.workersim.runner import WorkerHandle, running_worker, start_worker

__all__ = [
    "FaultSettings",
    "WorkerHandle",
    "WorkerOptions",
    "create_app",
    "running_worker",
    "start_worker",
]
