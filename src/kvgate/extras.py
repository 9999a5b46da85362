"""Optional dependencies: loaded only by the parts that need them, with a clear error.

The gateway and the emulated worker run without numpy or matplotlib; the
simulator, the benchmark reports and the demo need numpy (extra ``sim``), the
plots need matplotlib too (extra ``plots``).
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra."""


def require(module: str, extra: str) -> ModuleType:
    """Import ``module``, or raise ``MissingExtraError`` saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(
            f"{module} is needed here: install it with pip install 'kvgate[{extra}]'"
        ) from None
