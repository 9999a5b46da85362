"""The policy registry: policies by name, each with its config model.

Policies are registered explicitly in ``kvgate.core.policies`` (one place);
config picks one by name and an unknown name fails at start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from kvgate.core.policy import Policy


class UnknownPolicyError(ValueError):
    """Raised at start-up when config names a policy that is not registered."""


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """How to build one policy: its config model and a factory from that config."""

    name: str
    config: type[BaseModel]
    factory: Callable[[Any], Policy]
    summary: str = ""


class PolicyRegistry(Mapping[str, PolicySpec]):
    """An immutable name -> ``PolicySpec`` map with validated construction."""

    def __init__(self, specs: list[PolicySpec]) -> None:
        self._specs: dict[str, PolicySpec] = {}
        for spec in specs:
            if spec.name in self._specs:
                raise ValueError(f"policy {spec.name!r} registered twice")
            self._specs[spec.name] = spec

    def __getitem__(self, name: str) -> PolicySpec:
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(sorted(self._specs))
            raise UnknownPolicyError(f"unknown policy {name!r}; known: {known}") from None

    def __contains__(self, name: object) -> bool:
        # Mapping's own catches only KeyError; an unknown name raises UnknownPolicyError.
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def build(self, name: str, options: Mapping[str, Any] | None = None) -> Policy:
        """A new policy instance named ``name`` with ``options`` validated by its config."""
        spec = self[name]
        try:
            config = spec.config.model_validate(dict(options or {}))
        except ValidationError as exc:
            raise ValueError(f"policy {name!r}: {exc}") from exc
        return spec.factory(config)
