"""Optional dependencies: loaded only by the parts that need them, with a clear error.

The gateway and the emulated worker run without numpy or matplotlib; the
simulator (whose ``--out`` writes plots), the benchmark reports and the demo need
numpy and matplotlib (extra ``sim``, or ``plots``). The command line names the
extra to install when a command needs one that is missing (``cli.main``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS: dict[str, tuple[str, ...]] = {
    "sim": ("numpy", "matplotlib"),
    "plots": ("numpy", "matplotlib"),
    "kvevents": ("zmq", "msgspec"),
    "tokenizer": ("tokenizers", "jinja2"),
    "llamacpp": ("xllamacpp",),
}
"""Each extra and the modules it brings, by import name (pyproject.toml's optional
dependencies; ``tests/test_packaging.py`` holds the two together)."""


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


def missing_extra(exc: ImportError) -> MissingExtraError | None:
    """``exc`` as a ``MissingExtraError`` naming the extra that installs the module it
    could not import, or ``None`` when no extra does (a bug, not a missing install)."""
    if isinstance(exc, MissingExtraError):
        return exc
    module = (exc.name or "").partition(".")[0]
    for extra, modules in EXTRAS.items():
        if module in modules:
            return MissingExtraError(
                f"{module} is needed here: install it with pip install 'kvgate[{extra}]'"
            )
    return None
