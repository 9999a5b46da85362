"""A rollout's state and what it remembers: the values the controller reads and returns.

Split from ``rollout`` so the state machine stands apart from its records (progress,
past runs, alerts, updates), which the store, the admin API and the alert sender share.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import Field

from kvgate.core.gates import GateResult, StrictModel, Verdict
from kvgate.core.versions import ModelVersions, VersionWeights
from kvgate.core.window import WindowStats
from kvgate.types import Seconds


class RolloutState(StrEnum):
    """Where a rollout is; the last three are final."""

    PENDING = "pending"
    PROGRESSING = "progressing"
    PAUSED = "paused"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"

    @property
    def finished(self) -> bool:
        """True for promoted, rolled back and aborted."""
        return self in (RolloutState.PROMOTED, RolloutState.ROLLED_BACK, RolloutState.ABORTED)


class PauseReason(StrEnum):
    """Why a rollout is paused."""

    MANUAL = "manual"
    INCONCLUSIVE = "inconclusive"


class AlertReason(StrEnum):
    """Why an alert was raised."""

    GATE_FAILED = "gate_failed"
    MANUAL = "manual"
    INCONCLUSIVE = "inconclusive"
    PROMOTED = "promoted"


class Alert(StrictModel):
    """A rollout event for the alert webhook. ``step`` counts from 1."""

    rollout: str
    reason: AlertReason
    gate: str | None
    observed: float | None
    bound: float | None
    step: int
    weight: float
    message: str


class PastRun(StrictModel):
    """How an earlier, finished run of a rollout ended."""

    state: RolloutState
    steps: tuple[float, ...]
    started_at: Seconds | None = None
    finished_at: Seconds | None = None
    failed_gate: str | None = None
    message: str = ""


MAX_HISTORY = 20
"""Past runs a rollout keeps (the oldest are forgotten first)."""


class RolloutProgress(StrictModel):
    """Everything a controller remembers besides its spec (what the store keeps)."""

    state: RolloutState = RolloutState.PENDING
    pause_reason: PauseReason | None = None
    step_index: int = Field(default=0, ge=0)
    canary_weight: float = Field(default=0.0, ge=0, le=100)
    started_at: Seconds | None = None
    step_started_at: Seconds | None = None
    finished_at: Seconds | None = None
    evaluations: int = 0
    step_evaluations: int = 0
    step_requests: int = 0
    last_evaluated_at: Seconds | None = None
    last_gates: tuple[GateResult, ...] = ()
    baseline_reference: WindowStats | None = None
    message: str = ""
    history: tuple[PastRun, ...] = ()
    """Earlier runs of the same rollout id, oldest first (a re-start keeps why they ended)."""


class InvalidTransitionError(ValueError):
    """A manual action that does not apply in the rollout's current state (HTTP 409)."""


@dataclass(frozen=True, slots=True)
class RolloutUpdate:
    """What one evaluation or manual action decided.

    ``changed`` is true when the state or the weights moved: the driver then
    publishes ``weights`` (and, with ``promote``, the new stable version). The
    driver saves the controller after every call (its counters move too).
    ``reason`` is a short stable token for logs and metric labels: ``pending``,
    ``started``, ``waiting``, ``advanced``, ``inconclusive``, ``paused``,
    ``manual_pause``, ``resumed``, ``promoted``, ``rolled_back``, ``aborted``.
    """

    state: RolloutState
    reason: str
    weights: VersionWeights
    step_index: int
    gates: tuple[GateResult, ...] = ()
    alert: Alert | None = None
    promote: bool = False
    changed: bool = False

    @property
    def failed_gates(self) -> tuple[GateResult, ...]:
        """Gates whose verdict is fail."""
        return tuple(g for g in self.gates if g.verdict is Verdict.FAIL)

    def apply(self, versions: ModelVersions, canary: str) -> ModelVersions:
        """The model's versions after this update (weights, and stable on promotion)."""
        updated = versions.with_weights(self.weights)
        return updated.with_stable(canary) if self.promote else updated
