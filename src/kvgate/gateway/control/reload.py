"""Configuration reload in operation: ``SIGHUP`` and ``POST /admin/reload``.

The config file is read and validated again; the new configuration is compared
with the one in force, section by section. What can change live is applied:

- ``workers``: new URLs are added (probed first), vanished ones drained, a
  changed entry is drained and re-added;
- ``models`` (version weights and stable versions; refused for a model whose
  weights a rollout controls);
- ``policy.options`` (the policy is rebuilt with them, from the gateway's own
  registry: its learned state, e.g. a prefix index, starts empty, as after a
  restart); an option the policy refuses refuses the reload, naming it;
- ``model_aliases``, ``discovery``, ``admin_token``, ``log_level``.

Anything else that differs (``listen``, ``store``, ``api_keys``, ``limits``...)
needs a restart: the reload is refused as a whole, naming those keys, and
nothing is applied. A request in flight is never affected: workers leave by
draining, and the policy and the aliases are one ``RoutingState`` replaced whole
(``gateway.routing``): every reader sees the new one at once, and a request placed
before reports its end to the policy that placed it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from kvgate.core.policy import Policy
from kvgate.gateway.config import ConfigError, GatewayConfig
from kvgate.gateway.control.versions import from_config
from kvgate.gateway.dataplane.errors import GatewayError

if TYPE_CHECKING:
    from kvgate.gateway.app import Gateway

log = logging.getLogger("kvgate.gateway.control.reload")

LIVE_KEYS = frozenset(
    {"workers", "models", "policy", "model_aliases", "discovery", "admin_token", "log_level"}
)
"""Top-level keys a reload may change; ``policy`` only in its ``options``."""


class ReloadRefusedError(GatewayError):
    """409: the new configuration changes what only a restart can; nothing was applied."""

    status = 409
    type = "invalid_request_error"
    code = "reload_refused"


class NoConfigSourceError(GatewayError):
    """409: the gateway was not started from a config file, so there is nothing to re-read."""

    status = 409
    type = "invalid_request_error"
    code = "no_config_file"


@dataclass(slots=True)
class ReloadResult:
    """What one reload changed."""

    changed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``POST /admin/reload`` answer."""
        return {
            "changed": self.changed,
            "workers_added": self.added,
            "workers_removed": self.removed,
        }


def restart_keys(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """The keys that differ between ``old`` and ``new`` but cannot change live."""
    before, after = old.model_dump(mode="json"), new.model_dump(mode="json")
    keys = [k for k in sorted(before) if before[k] != after[k] and k not in LIVE_KEYS]
    if old.policy.name != new.policy.name:
        keys.append("policy.name")
    return keys


class Reloader:
    """Applies a new configuration to a running gateway, or refuses it naming the keys."""

    def __init__(self, gateway: Gateway, source: Callable[[], GatewayConfig] | None = None) -> None:
        self.gateway = gateway
        self.source = source
        self.reloads = 0

    def read(self) -> GatewayConfig:
        """The configuration source (the config file) read again and validated."""
        if self.source is None:
            raise NoConfigSourceError("the gateway was started without --config: nothing to reload")
        try:
            return self.source()
        except ConfigError as exc:
            raise ReloadRefusedError(f"reload refused: {exc}") from None

    def check(self, new: GatewayConfig) -> Policy | None:
        """Refuse ``new`` (``ReloadRefusedError``) if applying it would be refused, changing
        nothing; else the policy it asks for (``None``: the one in force stays)."""
        gw = self.gateway
        old = gw.config
        refused = restart_keys(old, new)
        if refused:
            raise ReloadRefusedError(
                "reload refused: these keys cannot change without a restart: " + ", ".join(refused)
            )
        for model, cfg in new.models.items():
            if old.models.get(model) != cfg and gw.control.rollouts.active_for(model) is not None:
                raise ReloadRefusedError(
                    f"reload refused: models.{model}: a rollout controls its weights"
                )
        return self._policy(old, new)

    async def reload_source(self) -> ReloadResult:
        """Re-read the configuration source (the config file) and apply it."""
        return await self.apply(self.read())

    async def apply(self, new: GatewayConfig) -> ReloadResult:
        """Apply ``new``: everything live, or nothing when a restart-only key changed."""
        gw = self.gateway
        old = gw.config
        policy = self.check(new)  # before anything is applied: it may refuse
        result = ReloadResult()
        await self._workers(old, new, result)
        for model, cfg in new.models.items():
            if old.models.get(model) != cfg:
                gw.control.versions.replace(from_config(model, cfg))
                await gw.control.rollouts.publish_model(model)
                result.changed.append(f"models.{model}")
        aliases = new.model_aliases if new.model_aliases != old.model_aliases else None
        if policy is not None or aliases is not None:
            gw.routing.swap(policy=policy, aliases=aliases)  # one value, every reader at once
        if policy is not None:
            result.changed.append("policy.options")
        if aliases is not None:
            result.changed.append("model_aliases")
        if new.discovery != old.discovery:
            await gw.control.discovery.reconfigure(new.discovery)
            result.changed.append("discovery")
        for key in ("admin_token", "log_level"):
            if getattr(new, key) != getattr(old, key):
                result.changed.append(key)
        if new.log_level != old.log_level:
            logging.getLogger().setLevel(new.log_level.upper())
        gw.config = gw.control.config = new
        self.reloads += 1
        log.info(
            "configuration reloaded: changed %s; workers added %s, removed %s",
            result.changed or "nothing",
            result.added,
            result.removed,
        )
        return result

    def _policy(self, old: GatewayConfig, new: GatewayConfig) -> Policy | None:
        """The policy ``new`` asks for, built from the gateway's registry (``None``: the
        same as now); an option it refuses is a refused reload naming it."""
        if new.policy == old.policy:
            return None
        registry = self.gateway.registry
        try:
            return registry.build(new.policy.name, new.policy_options(registry))
        except ValueError as exc:
            raise ReloadRefusedError(f"reload refused: {_refusal(exc)}") from None

    async def _workers(self, old: GatewayConfig, new: GatewayConfig, result: ReloadResult) -> None:
        if new.workers == old.workers:
            return
        membership = self.gateway.control.membership
        before = {w.url: w for w in old.workers}
        after = {w.url: w for w in new.workers}
        for url, worker in before.items():
            if after.get(url) != worker and membership.pool.get(url) is not None:
                await membership.remove(url)
                result.removed.append(url)
        for url, worker in after.items():
            if before.get(url) == worker:
                continue
            if membership.pool.get(url) is not None:  # added by discovery or the admin API
                log.warning("reload: worker %s is already in the pool; kept as it is", url)
                continue
            await membership.add(worker)
            result.added.append(url)
        result.changed.append("workers")


def _refusal(exc: ValueError) -> str:
    """What the policy refused, naming each option (``policy.options.stay: ...``)."""
    cause = exc.__cause__
    if isinstance(cause, ValidationError):
        return "; ".join(
            "policy.options." + ".".join(str(p) for p in err["loc"]) + f": {err['msg']}"
            for err in cause.errors()
        )
    return f"policy: {exc}"
