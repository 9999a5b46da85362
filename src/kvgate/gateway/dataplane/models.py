"""The models a fleet serves, as clients see them: listing, aliases, unknown names.

A gateway that starts with an empty fleet (discovery has not found a worker, or
they have not answered their first probe) cannot tell a wrong model name from one
not served yet, so it answers 503, which clients retry, rather than 404.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvgate.gateway.dataplane.errors import (
    GatewayError,
    ModelNotFoundError,
    NoHealthyWorkerError,
)
from kvgate.gateway.observe.pool import WorkerPool


def check_model(pool: WorkerPool, model: str) -> None:
    """Raise ``unknown_model_error`` when no worker serves ``model``."""
    if not pool.serves(model):
        raise unknown_model_error(pool, model)


def unknown_model_error(pool: WorkerPool, model: str) -> GatewayError:
    """404 for a model no worker serves; 503 while some worker's model is not known yet."""
    if len(pool) == 0 or any(worker.model is None for worker in pool):
        return NoHealthyWorkerError(f"no worker serving {model!r} is known yet; retry later")
    return ModelNotFoundError(f"The model {model!r} does not exist", param="model")


def models_payload(
    models: Mapping[str, list[str]], aliases: Mapping[str, str] | None = None
) -> dict[str, object]:
    """The ``GET /v1/models`` body: the models the fleet serves, and aliases of them."""
    data: list[dict[str, object]] = [
        {"id": model, "object": "model", "created": 0, "owned_by": "kvgate", "versions": versions}
        for model, versions in models.items()
    ]
    for alias, target in (aliases or {}).items():
        if target in models:
            data.append(
                {
                    "id": alias,
                    "object": "model",
                    "created": 0,
                    "owned_by": "kvgate",
                    "versions": models[target],
                    "alias_of": target,
                }
            )
    return {"object": "list", "data": data}
