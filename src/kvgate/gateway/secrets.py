"""Values of ``kvgate.yaml`` that come from the environment or from files.

Secrets do not belong in a config file checked into a repository or a
ConfigMap. Two general rules, applied to the raw YAML before it is validated:

- ``${NAME}`` in any string is replaced by the environment variable ``NAME``
  (``${NAME:-default}`` when it may be unset; ``$${`` for a literal ``${``).
  An unset variable without a default is an error naming the key.
- a key ``X_file`` is replaced by ``X`` holding the file's content without its
  trailing newline (a Kubernetes Secret mounted as files); for ``api_keys`` the
  file holds one key per line. Giving both ``X`` and ``X_file`` is an error.

So ``admin_token_file: /run/secrets/admin_token``, ``api_keys_file: ...``,
``workers: [{url: ..., api_key: "${VLLM_API_KEY}"}]`` and
``store: {url: "redis://redis:6379/0", password_file: ...}`` all work.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FILE_SUFFIX = "_file"
LIST_KEYS = frozenset({"api_keys"})
"""Keys whose ``_file`` holds one value per line."""

_VARIABLE = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class SecretError(ValueError):
    """A ``${NAME}`` or ``X_file`` could not be resolved; the message names the key."""


def resolve(data: Any, env: Mapping[str, str] | None = None, *, at: str = "") -> Any:
    """``data`` with every ``${NAME}`` expanded and every ``X_file`` read into ``X``."""
    environ = os.environ if env is None else env
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for key, value in data.items():
            path = f"{at}.{key}" if at else str(key)
            out[key] = resolve(value, environ, at=path)
        return _read_files(out, at)
    if isinstance(data, list):
        return [resolve(item, environ, at=f"{at}.{i}") for i, item in enumerate(data)]
    if isinstance(data, str) and "${" in data:
        return _expand(data, environ, at)
    return data


def _expand(text: str, env: Mapping[str, str], at: str) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(1):  # $${...}: a literal ${...}
            return match.group(0)[1:]
        name, default = match.group(2), match.group(3)
        value = env.get(name)
        if value is None:
            if default is None:
                raise SecretError(f"{at}: environment variable {name} is not set")
            return default
        return value

    return _VARIABLE.sub(one, text)


def _read_files(mapping: dict[str, Any], at: str) -> dict[str, Any]:
    for key in [k for k in mapping if isinstance(k, str) and k.endswith(FILE_SUFFIX)]:
        target = key[: -len(FILE_SUFFIX)]
        path = f"{at}.{key}" if at else key
        where = mapping.pop(key)
        if where is None:
            continue
        if target in mapping and mapping[target] not in (None, []):
            raise SecretError(f"{path}: give {target} or {key}, not both")
        if not isinstance(where, str):
            raise SecretError(f"{path}: must be a file path")
        try:
            text = Path(where).read_text()
        except OSError as exc:
            raise SecretError(f"{path}: cannot read {where}: {exc.strerror}") from None
        if target in LIST_KEYS:
            mapping[target] = [line.strip() for line in text.splitlines() if line.strip()]
        else:
            mapping[target] = text.rstrip("\r\n")
    return mapping
