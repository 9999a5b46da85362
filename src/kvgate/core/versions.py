"""A model's versions, their traffic weights, and which version serves a request.

Assignment is a pure function of its inputs so that every gateway replica picks
the same version for the same session without asking the store: a session key
is hashed (xxh3, ``core.hashing.key_hash``) to a point in [0, 1), and the point
falls into one version's share of the cumulative weights.

Precedence, first match wins:

1. ``pinned`` (header ``X-Model-Version``): that version, if the model has it,
   even at weight 0 (so a canary can be tried by hand before it gets traffic).
   An unknown version raises ``UnknownVersionError``; a blank one
   ``InvalidVersionError``.
2. ``bound``: the version of the session's affinity (the driver passes it) stays,
   as long as that version still carries traffic. A version whose weight fell to
   0 (a rolled-back canary, or the old stable after a promotion) no longer holds
   its sessions: they are reassigned by weight.
3. A session key: weighted by the hash of the key (stable across replicas).
4. No session key: weighted by the hash of the request id (per request).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from kvgate.core.hashing import key_hash
from kvgate.types import SessionKey

# A fixed seed keeps the hash stable across processes, releases and machines;
# changing it would move every new session to a different version.
_HASH_SEED = 0x6B7667617465  # "kvgate"
_UNIT = float(1 << 64)


class VersionError(ValueError):
    """A request or config names a model version that cannot be used.

    ``code`` is the stable token the gateway puts in the OpenAI error body.
    """

    code = "invalid_model_version"

    def __init__(self, message: str, *, model: str, version: str) -> None:
        super().__init__(message)
        self.model = model
        self.version = version


class InvalidVersionError(VersionError):
    """A pinned version that is not a usable name (blank); the gateway answers 400."""

    code = "invalid_model_version"


class UnknownVersionError(VersionError, LookupError):
    """A pinned version the model does not have; the gateway answers 404."""

    code = "model_version_not_found"


class AssignReason(StrEnum):
    """Why a request got its version; a metric label and debug header value."""

    PINNED = "pinned"
    STICKY = "sticky"
    SESSION_HASH = "session_hash"
    REQUEST_HASH = "request_hash"
    REASSIGNED = "reassigned"  # the bound version no longer carries traffic


class VersionAssignment(NamedTuple):
    """The version chosen for one request and why (unpacks as ``version, reason``)."""

    version: str
    reason: AssignReason


class VersionWeights(Mapping[str, float]):
    """Validated, immutable traffic weights, version -> weight (only ratios matter).

    Weights are kept sorted by version name so the cumulative split, and hence
    every assignment, does not depend on the order config or JSON listed them.
    """

    __slots__ = ("_items",)

    def __init__(self, weights: Mapping[str, float] | Iterable[tuple[str, float]]) -> None:
        pairs = list(weights.items() if isinstance(weights, Mapping) else weights)
        seen: set[str] = set()
        for name, weight in pairs:
            if not name or not name.strip():
                raise ValueError("version names must be non-empty")
            if name in seen:
                raise ValueError(f"version {name!r} listed twice")
            seen.add(name)
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(
                    f"weight of version {name!r} must be finite and >= 0, not {weight}"
                )
        if not pairs:
            raise ValueError("a model needs at least one version")
        if sum(w for _, w in pairs) <= 0:
            raise ValueError("version weights must sum to more than 0")
        self._items: tuple[tuple[str, float], ...] = tuple(sorted((n, float(w)) for n, w in pairs))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, VersionWeights):
            return self._items == other._items
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"VersionWeights({dict(self._items)!r})"

    def __getitem__(self, name: str) -> float:
        for version, weight in self._items:
            if version == name:
                return weight
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def total(self) -> float:
        """The sum of all weights (> 0 by construction)."""
        return sum(w for _, w in self._items)

    def share(self, version: str) -> float:
        """The fraction of new traffic ``version`` receives (0 for unknown versions)."""
        return self.get(version, 0.0) / self.total

    def pick(self, point: float) -> str:
        """The version whose cumulative share contains ``point`` in [0, 1)."""
        target = point * self.total
        cumulative = 0.0
        last = ""
        for name, weight in self._items:
            if weight <= 0:
                continue
            cumulative += weight
            last = name
            if target < cumulative:
                return name
        # Float rounding can leave a point just past the last edge.
        return last

    def to_dict(self) -> dict[str, float]:
        """Plain JSON-ready form."""
        return dict(self._items)


@dataclass(frozen=True, slots=True)
class ModelVersions:
    """All versions of one model: traffic weights and which one is stable.

    Every known version appears in ``weights``; a version at weight 0 exists
    (it can be pinned) but takes no new traffic.
    """

    model: str
    weights: VersionWeights
    stable: str
    _names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model name must be non-empty")
        object.__setattr__(self, "_names", frozenset(self.weights))
        if self.stable not in self._names:
            raise ValueError(f"stable version {self.stable!r} is not a version of {self.model!r}")

    @classmethod
    def single(cls, model: str, version: str = "default") -> ModelVersions:
        """A model with one version taking all traffic (the usual case)."""
        return cls(model, VersionWeights({version: 1.0}), version)

    @property
    def versions(self) -> frozenset[str]:
        """Names of every known version."""
        return self._names

    def has(self, version: str) -> bool:
        """True when ``version`` is a known version of this model."""
        return version in self._names

    def with_weights(self, weights: Mapping[str, float]) -> ModelVersions:
        """New weights for the versions named; every other known version gets 0.

        A rollout only names its baseline and canary, so a third version stops
        taking new traffic while the rollout runs. Unknown names are an error.
        """
        unknown = sorted(set(weights) - self._names)
        if unknown:
            raise ValueError(f"model {self.model!r} has no version(s) {', '.join(unknown)}")
        merged = {name: float(weights.get(name, 0.0)) for name in self._names}
        return ModelVersions(self.model, VersionWeights(merged), self.stable)

    def with_stable(self, version: str) -> ModelVersions:
        """The same weights with ``version`` marked stable (after a promotion)."""
        return ModelVersions(self.model, self.weights, version)

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready form."""
        return {"model": self.model, "stable": self.stable, "weights": self.weights.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ModelVersions:
        """Inverse of ``to_dict``; raises ``ValueError`` on malformed data."""
        weights = data.get("weights")
        model, stable = data.get("model"), data.get("stable")
        if not isinstance(weights, Mapping) or not isinstance(model, str):
            raise ValueError("model versions need 'model' (str) and 'weights' (object)")
        if not isinstance(stable, str):
            raise ValueError("model versions need 'stable' (str)")
        return cls(model, VersionWeights({str(k): float(v) for k, v in weights.items()}), stable)


def hash_point(domain: str, key: str) -> float:
    """A uniform point in [0, 1) from ``key``, independent across ``domain`` values."""
    return key_hash(f"{domain}\x00{key}", _HASH_SEED) / _UNIT


def assign_version(
    versions: ModelVersions,
    session_key: SessionKey | None,
    request_id: str,
    pinned: str | None = None,
    bound: str | None = None,
) -> VersionAssignment:
    """Choose the version that serves one request (see the module docstring for rules).

    ``bound`` is the version of the session's existing affinity, if any.
    Raises ``InvalidVersionError`` / ``UnknownVersionError`` for a bad ``pinned``.
    """
    if pinned is not None:
        name = pinned.strip()
        if not name:
            raise InvalidVersionError(
                "model version must not be blank", model=versions.model, version=pinned
            )
        if not versions.has(name):
            known = ", ".join(sorted(versions.versions))
            raise UnknownVersionError(
                f"model {versions.model!r} has no version {name!r} (known: {known})",
                model=versions.model,
                version=name,
            )
        return VersionAssignment(name, AssignReason.PINNED)
    # The model name is part of the hash domain so a session lands in
    # independent shares of different models' rollouts.
    if session_key is not None:
        if bound is not None and versions.weights.get(bound, 0.0) > 0:
            return VersionAssignment(bound, AssignReason.STICKY)
        point = hash_point(f"session:{versions.model}", session_key)
        reason = AssignReason.SESSION_HASH if bound is None else AssignReason.REASSIGNED
        return VersionAssignment(versions.weights.pick(point), reason)
    point = hash_point(f"request:{versions.model}", request_id)
    return VersionAssignment(versions.weights.pick(point), AssignReason.REQUEST_HASH)
