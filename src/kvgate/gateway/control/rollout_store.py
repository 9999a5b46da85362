"""Where rollout state lives in the store, so restarts and other replicas see it.

Blobs (names under the configured prefix, ``kvgate`` by default)::

    kvgate:rollouts                      JSON list of rollout ids
    kvgate:rollout:<id>                  RolloutController.to_json()
    kvgate:rollout:<id>:replicas         JSON list of replicas publishing windows
    kvgate:rollout:<id>:window:<replica> one replica's outcome windows of the rollout
    kvgate:models                        JSON list of models with stored versions
    kvgate:model:<model>                 ModelVersions.to_dict()

and the lease ``kvgate:rollout-controller``: the replica holding it judges the
gates and moves weights; every replica reads the weights it publishes. Lists
are read-modify-written without a transaction; a replica that loses an entry
to a concurrent writer adds it again on its next tick.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from kvgate.core.rollout import RolloutController
from kvgate.core.versions import ModelVersions
from kvgate.core.window import OutcomeWindow
from kvgate.store.base import AffinityStore
from kvgate.types import Seconds

log = logging.getLogger("kvgate.gateway.control.rollouts")

MAX_IDS = 256
"""At most this many rollout ids are listed; the oldest are dropped first."""


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


class RolloutBlobs:
    """Typed reads and writes of the rollout blobs."""

    def __init__(self, store: AffinityStore, prefix: str = "kvgate") -> None:
        self.store = store
        self.prefix = prefix
        self.lease = f"{prefix}:rollout-controller"

    async def _list(self, name: str) -> list[str]:
        raw = await self.store.get_blob(name)
        if raw is None:
            return []
        try:
            items = json.loads(raw)
        except ValueError:
            log.error("store blob %s is not JSON; ignoring it", name)
            return []
        return [str(x) for x in items] if isinstance(items, list) else []

    async def _add(self, name: str, item: str, keep: int = MAX_IDS) -> None:
        items = await self._list(name)
        if item in items:
            return
        items.append(item)
        await self.store.put_blob(name, _dumps(items[-keep:]))

    # -- rollouts --------------------------------------------------------------

    async def rollout_ids(self) -> list[str]:
        """Every listed rollout id, oldest first."""
        return await self._list(f"{self.prefix}:rollouts")

    async def load(self, rollout_id: str) -> RolloutController | None:
        """The stored controller of ``rollout_id`` (``None`` if absent or unreadable)."""
        raw = await self.store.get_blob(f"{self.prefix}:rollout:{rollout_id}")
        if raw is None:
            return None
        try:
            return RolloutController.from_json(raw)
        except (ValueError, KeyError, TypeError):
            log.exception("stored rollout %s is unreadable; ignoring it", rollout_id)
            return None

    async def save(self, controller: RolloutController) -> None:
        """Store ``controller`` and list its id."""
        rollout_id = controller.spec.rollout_id
        await self.store.put_blob(f"{self.prefix}:rollout:{rollout_id}", controller.to_json())
        await self._add(f"{self.prefix}:rollouts", rollout_id)

    # -- windows ---------------------------------------------------------------

    async def publish_windows(
        self, rollout_id: str, replica: str, now: Seconds, windows: Mapping[str, OutcomeWindow]
    ) -> None:
        """Store this replica's windows of a rollout (and list the replica)."""
        body = {"at": now, "versions": {v: w.to_dict() for v, w in windows.items()}}
        await self.store.put_blob(
            f"{self.prefix}:rollout:{rollout_id}:window:{replica}", _dumps(body)
        )
        await self._add(f"{self.prefix}:rollout:{rollout_id}:replicas", replica, keep=64)

    async def other_windows(
        self, rollout_id: str, replica: str, newer_than: Seconds
    ) -> list[dict[str, OutcomeWindow]]:
        """Windows other replicas published after ``newer_than``."""
        out = []
        for other in await self._list(f"{self.prefix}:rollout:{rollout_id}:replicas"):
            if other == replica:
                continue
            raw = await self.store.get_blob(f"{self.prefix}:rollout:{rollout_id}:window:{other}")
            if raw is None:
                continue
            try:
                body: dict[str, Any] = json.loads(raw)
                if float(body["at"]) < newer_than:
                    continue
                out.append(
                    {v: OutcomeWindow.from_dict(d) for v, d in dict(body["versions"]).items()}
                )
            except (ValueError, KeyError, TypeError):
                log.warning("rollout %s: unreadable window of replica %s", rollout_id, other)
        return out

    # -- model versions --------------------------------------------------------

    async def model_names(self) -> list[str]:
        """Models whose versions are stored."""
        return await self._list(f"{self.prefix}:models")

    async def load_model(self, model: str) -> ModelVersions | None:
        """The stored versions of ``model``."""
        raw = await self.store.get_blob(f"{self.prefix}:model:{model}")
        if raw is None:
            return None
        try:
            return ModelVersions.from_dict(json.loads(raw))
        except (ValueError, TypeError):
            log.error("stored versions of model %s are unreadable; ignoring them", model)
            return None

    async def save_model(self, versions: ModelVersions) -> None:
        """Store ``versions`` (every replica applies them on its next tick)."""
        await self.store.put_blob(
            f"{self.prefix}:model:{versions.model}", _dumps(versions.to_dict())
        )
        await self._add(f"{self.prefix}:models", versions.model)
