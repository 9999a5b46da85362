"""The routing state in force: one immutable value that a reload replaces whole.

Everything the request path reads of the configuration that a reload may change
and that is not the workers' or the versions' own (the routing policy, the model
aliases) is one ``RoutingState``. The router, the warm-ups, the membership, the
proxy, the passthrough routes and the endpoint picker all hold the one ``Routing``
cell and read ``routing.state`` when they need it, so a reload is one assignment
(``swap``) that every reader sees at once: none can be missed, and none sees half
of a reload. A request reads the state once when it is placed, and its attempt
reports its end to the policy that placed it (``dataplane.attempt``), so a policy's
books stay paired across a reload.

Model versions and their weights are not here: the rollout controller changes
them while the gateway runs, so they live in the ``VersionRegistry``, whose entries
are immutable ``ModelVersions`` values replaced per model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from kvgate.core.policy import Policy


@dataclass(frozen=True, slots=True)
class RoutingState:
    """The policy and aliases requests are routed with (never changed in place)."""

    policy: Policy
    aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Model names clients may use for another model (``model_aliases``)."""
    generation: int = 0
    """How many reloads replaced the state before this one (0: as started)."""


class Routing:
    """The one cell holding the ``RoutingState`` in force."""

    __slots__ = ("_state",)

    def __init__(self, state: RoutingState) -> None:
        self._state = state

    @classmethod
    def of(cls, policy: Policy, aliases: Mapping[str, str] | None = None) -> Routing:
        """A cell holding ``policy`` and ``aliases`` (none by default)."""
        return cls(RoutingState(policy, _frozen(aliases or {})))

    @property
    def state(self) -> RoutingState:
        """The state in force: read it once per decision."""
        return self._state

    def swap(
        self, *, policy: Policy | None = None, aliases: Mapping[str, str] | None = None
    ) -> RoutingState:
        """Replace the state whole with ``policy`` and/or ``aliases`` changed; the new state."""
        old = self._state
        new = replace(
            old,
            policy=policy if policy is not None else old.policy,
            aliases=_frozen(aliases) if aliases is not None else old.aliases,
            generation=old.generation + 1,
        )
        self._state = new
        return new


def _frozen(aliases: Mapping[str, str]) -> Mapping[str, str]:
    """A read-only copy of ``aliases`` (the caller's dict may change; the state's may not)."""
    return MappingProxyType(dict(aliases))
