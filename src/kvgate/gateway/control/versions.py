"""The live registry of model versions: which version serves each request.

Every request of a model with registered versions is assigned one before the
policy runs (``core.versions.assign_version``: pinned by header, else the
session's bound version while it still carries traffic, else by weight from the
hash of the session key, else of the request id), and the policy then sees only
the workers of that version (``WorkerPool.snapshot(..., version)``). A model with no registered
versions is not split: any of its workers may serve it.

The request path only reads: ``assign`` is one dict lookup and a hash, with no
await and no lock. Changes (config, admin API, the rollout controller) replace
a model's ``ModelVersions`` wholesale, so a reader sees the old or the new
split, never half of one. Sessions keep their version through weight changes
because the version lives in their affinity.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kvgate.core.decision import Affinity
from kvgate.core.features import RequestFeatures
from kvgate.core.versions import (
    InvalidVersionError,
    ModelVersions,
    UnknownVersionError,
    VersionWeights,
    assign_version,
)
from kvgate.gateway.control.config import ModelVersionsConfig
from kvgate.gateway.dataplane.errors import GatewayError, InvalidRequestError, NotFoundError
from kvgate.gateway.observe.pool import WorkerPool


class VersionNotFoundError(NotFoundError):
    """404: the model has no such version."""

    code = "model_version_not_found"


class VersionConflictError(GatewayError):
    """409: the change conflicts with the registry's state (stable version, rollout)."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"


def from_config(model: str, config: ModelVersionsConfig) -> ModelVersions:
    """The ``ModelVersions`` a ``models:`` config entry describes."""
    return ModelVersions(model, VersionWeights(config.weights), config.stable_version())


Listener = Callable[[ModelVersions | None, ModelVersions], None]
"""Called with (old, new) after a model's versions changed."""


class VersionRegistry:
    """Each model's versions and weights, as the request path reads them."""

    def __init__(
        self,
        pool: WorkerPool,
        configured: Mapping[str, ModelVersionsConfig] | None = None,
    ) -> None:
        self.pool = pool
        self._models: dict[str, ModelVersions] = {
            model: from_config(model, cfg) for model, cfg in (configured or {}).items()
        }
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(old, new)`` after every change (metrics, persistence)."""
        self._listeners.append(listener)

    def get(self, model: str) -> ModelVersions | None:
        """The model's registered versions, or ``None`` when it is not split."""
        return self._models.get(model)

    def models(self) -> dict[str, ModelVersions]:
        """Every registered model's versions (a copy)."""
        return dict(self._models)

    def served_versions(self, model: str) -> set[str]:
        """Versions some worker of ``model`` serves (configured or advertised)."""
        return set(self.pool.models().get(model, ()))

    def known_versions(self, model: str) -> set[str]:
        """Registered versions of ``model`` plus those its workers serve."""
        versions = self._models.get(model)
        known = set(versions.versions) if versions is not None else set()
        return known | self.served_versions(model)

    # -- the request path ----------------------------------------------------

    def assign(self, features: RequestFeatures, affinity: Affinity | None) -> str | None:
        """The version that serves this request, or ``None`` when the model is not split.

        Raises ``VersionNotFoundError`` (404) for a pinned version the model lacks
        and ``InvalidRequestError`` (400) for a blank one.
        """
        versions = self._models.get(features.model)
        pinned = features.pinned_version
        if versions is None:
            if pinned is not None and pinned not in self.served_versions(features.model):
                raise VersionNotFoundError(
                    f"model {features.model!r} has no version {pinned!r}", param="model"
                )
            return None
        try:
            version, _ = assign_version(
                versions,
                features.affinity_key,
                features.request_id,
                pinned=pinned,
                bound=affinity.version if affinity is not None else None,
            )
        except UnknownVersionError as exc:
            raise VersionNotFoundError(str(exc), param="model") from None
        except InvalidVersionError as exc:
            raise InvalidRequestError(str(exc), code=exc.code) from None
        return version

    # -- changes ---------------------------------------------------------------

    def replace(self, versions: ModelVersions) -> None:
        """Make ``versions`` the model's split (from the rollout controller or the store)."""
        old = self._models.get(versions.model)
        if old == versions:
            return
        self._models[versions.model] = versions
        for listener in self._listeners:
            listener(old, versions)

    def set_weights(self, model: str, weights: Mapping[str, float]) -> ModelVersions:
        """Change some versions' weights; versions not named keep theirs.

        A model not registered yet is registered with every version its workers
        serve (those not named at weight 0). A name that is neither registered nor
        served is unknown (404).
        """
        current = self._models.get(model)
        if current is None:
            served = self.served_versions(model)
            if not served and not self.pool.serves(model):
                raise NotFoundError(f"no worker serves model {model!r}", code="model_not_found")
            merged = {name: 0.0 for name in served}
        else:
            merged = current.weights.to_dict()
        unknown = sorted(set(weights) - set(merged))
        if unknown:
            raise VersionNotFoundError(f"model {model!r} has no version(s) {', '.join(unknown)}")
        merged.update({name: float(w) for name, w in weights.items()})
        try:
            table = VersionWeights(merged)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="weights") from None
        stable = current.stable if current is not None else _heaviest(table)
        updated = ModelVersions(model, table, stable)
        self.replace(updated)
        return updated

    def add_version(self, model: str, version: str, weight: float = 0.0) -> ModelVersions:
        """Register ``version`` of ``model`` (weight 0 by default: pinnable, no traffic)."""
        if not version.strip():
            raise InvalidRequestError("version must be non-empty", param="version")
        current = self._models.get(model)
        if current is not None and current.has(version):
            raise VersionConflictError(f"model {model!r} already has version {version!r}")
        if current is None:
            merged = {name: 0.0 for name in self.served_versions(model)}
        else:
            merged = current.weights.to_dict()
        merged[version] = float(weight)
        try:
            table = VersionWeights(merged)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="weight") from None
        stable = current.stable if current is not None else _heaviest(table)
        updated = ModelVersions(model, table, stable)
        self.replace(updated)
        return updated

    def remove_version(self, model: str, version: str) -> ModelVersions:
        """Forget ``version``: it takes no traffic and cannot be pinned (its sessions move).

        The stable version cannot be removed (promote another one first).
        """
        current = self._models.get(model)
        if current is None or not current.has(version):
            raise VersionNotFoundError(f"model {model!r} has no registered version {version!r}")
        if version == current.stable:
            raise VersionConflictError(
                f"version {version!r} is the stable version of {model!r}; "
                "make another version stable first"
            )
        rest = {n: w for n, w in current.weights.to_dict().items() if n != version}
        try:
            table = VersionWeights(rest)
        except ValueError as exc:
            raise VersionConflictError(
                f"cannot remove {version!r}: no other version of {model!r} has weight ({exc})"
            ) from None
        updated = ModelVersions(model, table, current.stable)
        self.replace(updated)
        return updated

    def set_stable(self, model: str, version: str) -> ModelVersions:
        """Mark ``version`` as the stable version of ``model``."""
        current = self._models.get(model)
        if current is None or not current.has(version):
            raise VersionNotFoundError(f"model {model!r} has no registered version {version!r}")
        updated = current.with_stable(version)
        self.replace(updated)
        return updated

    def describe(self) -> dict[str, object]:
        """The admin view: every model, its versions, weights, stable and workers."""
        out: dict[str, object] = {}
        served = self.pool.models()
        for model in sorted(set(served) | set(self._models)):
            versions = self._models.get(model)
            workers: dict[str, list[str]] = {}
            for worker in self.pool:
                if worker.model == model:
                    workers.setdefault(worker.version, []).append(worker.id)
            out[model] = {
                "split": versions is not None,
                "stable": versions.stable if versions is not None else None,
                "weights": versions.weights.to_dict() if versions is not None else None,
                "workers": {v: sorted(ids) for v, ids in sorted(workers.items())},
            }
        return out


def _heaviest(weights: VersionWeights) -> str:
    return min(weights, key=lambda name: (-weights[name], name))
