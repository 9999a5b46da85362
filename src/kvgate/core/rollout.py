"""Canary rollouts: the spec, the gates, and a pure state machine that drives them.

A rollout moves new-session traffic of one model from a *baseline* version to a
*canary* version in weight steps (default 5, 10, 25, 50, 100 percent). The
driver calls ``RolloutController.evaluate`` every ``interval_s`` seconds with
the canary's and the baseline's window stats over the same span; the controller
answers with the new state, the new weights, every gate's verdict and, on a
transition worth telling someone about, an ``Alert``.

Semantics (after Argo Rollouts and Flagger):

- **Advance** when every gate passes *and* the step has lasted
  ``min_step_duration_s`` *and* the canary served ``min_requests_per_step``
  requests in the analysis span (shown as the pseudo-gate ``step_requests``,
  which never fails). Passing the last step promotes, whatever its weight:
  canary 100, baseline 0, and ``promote`` tells the registry to make the
  canary the stable version.
- **Fail** (any gate observes a value past its bound): roll back at once,
  canary weight 0, state ``rolled_back``, alert. This holds while paused too:
  a paused canary still takes traffic, so it is still judged.
- **Factor gates** compare with the baseline over the same span. When the
  baseline has too few samples there (it takes no traffic at a 100% step),
  its last span with enough samples stands in (``baseline_reference``).
- **Inconclusive** (a gate has fewer than its minimum samples: "no values found"
  never passes). While the step's minimum time has not passed this is just
  waiting. Once it has, the rollout goes ``paused`` with reason
  ``inconclusive`` (one alert), keeps the canary at its weight so data can
  arrive, keeps evaluating, and resumes on its own when the gates pass.
  A manual pause (reason ``manual``) only ends with ``resume``.
- Manual: ``start``, ``pause``, ``resume``, ``promote`` (full, or one step),
  ``abort`` (weight 0, state ``aborted``, alert reason ``manual``). An action
  that does not apply to the current state raises ``InvalidTransitionError``.

Analysis span: gates judge the current step only, ``[max(now - W, step start),
now]``; the driver asks ``analysis_start(now)`` and passes it as ``since`` to
``OutcomeWindow.stats``, whose window must be at least ``analysis_window_s``.

Seams for the gateway: ``to_dict``/``from_dict`` (or ``to_json``/``from_json``)
round-trip the whole controller for the store (``put_blob``), so a restarted
gateway, or the replica that takes over the rollout lease, resumes at the same
step with the same step start time and counters; only the lease holder calls
``evaluate`` and the manual actions, and every replica reads the weights it
publishes. ``RolloutUpdate.apply`` turns an update into the model's new
``ModelVersions``. ``status`` is the admin API's view. The state, progress, alert
and update values live in ``rollout_progress``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from kvgate.core.gates import (
    GateResult,
    Gates,
    StrictModel,
    Verdict,
    evaluate_gates,
    fmt_num,
    measured,
)
from kvgate.core.rollout_progress import (
    MAX_HISTORY,
    Alert,
    AlertReason,
    InvalidTransitionError,
    PastRun,
    PauseReason,
    RolloutProgress,
    RolloutState,
    RolloutUpdate,
)
from kvgate.core.versions import VersionWeights
from kvgate.core.window import QualityStats, WindowStats
from kvgate.types import Seconds

SCHEMA_VERSION = 1


class RolloutSpec(StrictModel):
    """One canary rollout, as the admin API or config gives it.

    Example::

        model: llama-3-8b
        baseline: v2.1
        canary: v3.0
        steps: [5, 10, 25, 50, 100]
        min_step_duration_s: 60
        min_requests_per_step: 100
        gates: {max_error_rate: 0.01, latency_p99: {max_factor: 1.5, max_s: 20}}
    """

    model: str = Field(min_length=1)
    baseline: str = Field(min_length=1)
    canary: str = Field(min_length=1)
    name: str | None = None
    steps: tuple[float, ...] = (5.0, 10.0, 25.0, 50.0, 100.0)
    min_step_duration_s: Seconds = Field(default=60.0, ge=0)
    min_requests_per_step: int = Field(default=100, ge=0)
    analysis_window_s: Seconds = Field(default=300.0, gt=0)
    interval_s: Seconds = Field(default=10.0, gt=0)
    gates: Gates = Gates()

    @field_validator("canary")
    @classmethod
    def _distinct(cls, canary: str, info: ValidationInfo) -> str:
        if canary == info.data.get("baseline"):
            raise ValueError("canary must differ from baseline")
        return canary

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: tuple[float, ...]) -> tuple[float, ...]:
        if not steps:
            raise ValueError("at least one step is needed")
        if any(not 0 < s <= 100 for s in steps):
            raise ValueError("each step is a canary weight in percent, in (0, 100]")
        if any(b <= a for a, b in pairwise(steps)):
            raise ValueError("steps must be strictly increasing")
        return steps

    @property
    def rollout_id(self) -> str:
        """The rollout's name in alerts, metrics and the store."""
        return self.name or f"{self.model}/{self.canary}"


# Final state -> (verb for messages, alert reason, canary weight after it).
_FINAL: dict[RolloutState, tuple[str, AlertReason, float]] = {
    RolloutState.PROMOTED: ("promoted", AlertReason.PROMOTED, 100.0),
    RolloutState.ROLLED_BACK: ("rolled back", AlertReason.GATE_FAILED, 0.0),
    RolloutState.ABORTED: ("aborted", AlertReason.MANUAL, 0.0),
}


# (gate name, WindowStats value field, WindowStats sample-count field)
class RolloutController:
    """The pure state machine of one rollout; time is passed to every method.

    It holds no clock, no I/O and no randomness: the same calls give the same
    updates, live or simulated, before or after a round-trip through the store.
    """

    __slots__ = ("_progress", "spec")

    def __init__(self, spec: RolloutSpec, progress: RolloutProgress | None = None) -> None:
        self.spec = spec
        self._progress = progress or RolloutProgress()
        if self._progress.step_index >= len(spec.steps):
            raise ValueError("step_index is past the last step")

    @property
    def progress(self) -> RolloutProgress:
        """The remembered state (immutable; replaced on every transition)."""
        return self._progress

    @property
    def state(self) -> RolloutState:
        """The current state."""
        return self._progress.state

    def weights(self) -> VersionWeights:
        """The current weights, in percent, of baseline and canary."""
        w = self._progress.canary_weight
        return VersionWeights({self.spec.baseline: 100.0 - w, self.spec.canary: w})

    def analysis_start(self, now: Seconds) -> Seconds:
        """Where the span of the next evaluation starts: the window, cut at the step start."""
        start = now - self.spec.analysis_window_s
        step_start = self._progress.step_started_at
        return start if step_start is None else max(start, step_start)

    # -- evaluation ----------------------------------------------------------

    def evaluate(
        self,
        now: Seconds,
        canary: WindowStats,
        baseline: WindowStats | None = None,
        quality: QualityStats | None = None,
    ) -> RolloutUpdate:
        """Judge the gates on stats over ``analysis_start(now)..now`` and move on."""
        p = self._progress
        if p.state not in (RolloutState.PROGRESSING, RolloutState.PAUSED):
            return self._set(p, p.state.value, ())
        need = self.spec.min_requests_per_step
        # Shown with the gates so the status view says what a step waits for.
        traffic = GateResult(
            name="step_requests",
            observed=float(canary.requests),
            bound=float(need),
            verdict=Verdict.PASS if canary.requests >= need else Verdict.INCONCLUSIVE,
            samples=canary.requests,
        )
        reference = p.baseline_reference
        takes_traffic = p.canary_weight < 100.0
        if (
            takes_traffic
            and baseline is not None
            and measured(baseline, self.spec.gates.min_samples)
        ):
            reference = baseline
        elif reference is not None or not takes_traffic:
            # The baseline takes no new traffic at a 100% step: its last measured
            # values stand in (or factor gates could never pass there), never the
            # few sticky stragglers it still serves, whose quantiles are noise.
            baseline = reference
        gates = (*evaluate_gates(self.spec.gates, canary, baseline, quality), traffic)
        seen = p.model_copy(
            update={
                "baseline_reference": reference,
                "evaluations": p.evaluations + 1,
                "step_evaluations": p.step_evaluations + 1,
                "step_requests": canary.requests,
                "last_evaluated_at": now,
                "last_gates": gates,
            }
        )
        failed = [g for g in gates if g.verdict is Verdict.FAIL]
        if failed:
            gate = failed[0]
            why = f"gate {gate.name} failed: observed {fmt_num(gate.observed)}"
            return self._finish(
                now,
                seen,
                RolloutState.ROLLED_BACK,
                why=f"{why}, bound {fmt_num(gate.bound)}",
                gate=gate,
                gates=gates,
            )
        if p.state is RolloutState.PAUSED and p.pause_reason is PauseReason.MANUAL:
            return self._set(seen, "paused", gates)

        step_start = p.step_started_at if p.step_started_at is not None else now
        time_met = now - step_start >= self.spec.min_step_duration_s
        pending = [g for g in gates if g.verdict is Verdict.INCONCLUSIVE]
        if time_met and not pending:
            return self._advance(now, seen, gates)
        if not time_met:
            return self._set(seen, "waiting", gates)
        why = self._wanting(pending[0])
        if p.state is RolloutState.PAUSED:
            # Still waiting: the message says what the latest evaluation lacks.
            return self._set(seen.model_copy(update={"message": f"inconclusive: {why}"}),
                             "inconclusive", gates)  # fmt: skip
        paused = seen.model_copy(
            update={
                "state": RolloutState.PAUSED,
                "pause_reason": PauseReason.INCONCLUSIVE,
                "message": f"inconclusive: {why}",
            }
        )
        alert = self._alert(AlertReason.INCONCLUSIVE, f"paused, too little data: {why}", pending[0])
        return self._set(paused, "inconclusive", gates, alert=alert, changed=True)

    def _wanting(self, gate: GateResult) -> str:
        """What an inconclusive gate lacks, in the numbers the status table shows."""
        g = self.spec.gates
        if gate.name == "step_requests":
            need = self.spec.min_requests_per_step
        elif gate.name == "quality" and g.quality is not None:
            need = g.quality.min_samples
        else:
            need = g.min_samples
        if gate.samples >= need:
            extra = " on the baseline too" if gate.name.endswith("_vs_baseline") else ""
            return f"{gate.name} has {gate.samples} samples; needs {need}{extra}"
        return f"{gate.name} has {gate.samples} of the {need} samples it needs"

    def _advance(
        self, now: Seconds, seen: RolloutProgress, gates: tuple[GateResult, ...]
    ) -> RolloutUpdate:
        last = len(self.spec.steps) - 1
        if seen.step_index >= last:
            return self._finish(
                now, seen, RolloutState.PROMOTED, why="all steps passed", gates=gates
            )
        index = seen.step_index + 1
        moved = seen.model_copy(
            update={
                "state": RolloutState.PROGRESSING,
                "pause_reason": None,
                "step_index": index,
                "canary_weight": self.spec.steps[index],
                "step_started_at": now,
                "step_evaluations": 0,
                "step_requests": 0,
                "message": f"advanced to step {index + 1}",
            }
        )
        return self._set(moved, "advanced", gates, changed=True)

    # -- manual actions --------------------------------------------------------

    def start(self, now: Seconds) -> RolloutUpdate:
        """Begin the first step (only from ``pending``)."""
        self._require({RolloutState.PENDING}, "start")
        started = self._progress.model_copy(
            update={
                "state": RolloutState.PROGRESSING,
                "step_index": 0,
                "canary_weight": self.spec.steps[0],
                "started_at": now,
                "step_started_at": now,
                "message": "started",
            }
        )
        return self._set(started, "started", (), changed=True)

    def pause(self, now: Seconds) -> RolloutUpdate:
        """Hold the current step until ``resume`` (gates still judged; failure rolls back)."""
        p = self._progress
        if p.state is RolloutState.PAUSED and p.pause_reason is PauseReason.MANUAL:
            raise InvalidTransitionError("cannot pause: rollout is already paused by hand")
        self._require({RolloutState.PROGRESSING, RolloutState.PAUSED}, "pause")
        paused = p.model_copy(
            update={
                "state": RolloutState.PAUSED,
                "pause_reason": PauseReason.MANUAL,
                "message": "paused by hand",
            }
        )
        return self._set(paused, "manual_pause", (), changed=True)

    def resume(self, now: Seconds) -> RolloutUpdate:
        """Leave a pause; the step's timer is not reset (the canary kept its traffic)."""
        self._require({RolloutState.PAUSED}, "resume")
        resumed = self._progress.model_copy(
            update={"state": RolloutState.PROGRESSING, "pause_reason": None, "message": "resumed"}
        )
        return self._set(resumed, "resumed", (), changed=True)

    def promote(self, now: Seconds, *, full: bool = True) -> RolloutUpdate:
        """Promote at once (``full``), or skip to the next step without waiting for gates."""
        self._require(
            {RolloutState.PENDING, RolloutState.PROGRESSING, RolloutState.PAUSED}, "promote"
        )
        p = self._progress
        if full or p.state is RolloutState.PENDING or p.step_index == len(self.spec.steps) - 1:
            return self._finish(now, p, RolloutState.PROMOTED, why="promoted by hand")
        return self._advance(now, p, ())

    def abort(self, now: Seconds, message: str = "aborted by hand") -> RolloutUpdate:
        """Roll back by hand: canary weight 0, state ``aborted``, alert reason ``manual``."""
        self._require(
            {RolloutState.PENDING, RolloutState.PROGRESSING, RolloutState.PAUSED}, "abort"
        )
        return self._finish(now, self._progress, RolloutState.ABORTED, why=message)

    # -- views and persistence ---------------------------------------------------

    def status(self, now: Seconds | None = None) -> dict[str, Any]:
        """The admin API's view: state, step, weights, and each gate's last value."""
        p, spec = self._progress, self.spec
        elapsed = None
        if now is not None and p.step_started_at is not None and not p.state.finished:
            elapsed = now - p.step_started_at
        return {
            "rollout": spec.rollout_id,
            "model": spec.model,
            "baseline": spec.baseline,
            "canary": spec.canary,
            "state": p.state.value,
            "pause_reason": p.pause_reason.value if p.pause_reason else None,
            "step": p.step_index + 1,
            "steps": list(spec.steps),
            "weights": self.weights().to_dict(),
            "step_started_at": p.step_started_at,
            "step_elapsed_s": elapsed,
            "min_step_duration_s": spec.min_step_duration_s,
            "step_requests": p.step_requests,
            "min_requests_per_step": spec.min_requests_per_step,
            "evaluations": p.evaluations,
            "last_evaluated_at": p.last_evaluated_at,
            "gates": [g.model_dump(mode="json") for g in p.last_gates],
            "failed_gate": next((g.name for g in p.last_gates if g.verdict is Verdict.FAIL), None),
            "message": p.message,
            "history": [run.model_dump(mode="json") for run in p.history],
        }

    def rerun(self, spec: RolloutSpec) -> RolloutController:
        """A new run of this (finished) rollout with ``spec``, remembering how this one ended."""
        p = self._progress
        if not p.state.finished:
            raise InvalidTransitionError(f"rollout {self.spec.rollout_id} is {p.state.value}")
        failed = next((g.name for g in p.last_gates if g.verdict is Verdict.FAIL), None)
        past = PastRun(
            state=p.state,
            steps=self.spec.steps,
            started_at=p.started_at,
            finished_at=p.finished_at,
            failed_gate=failed if p.state is RolloutState.ROLLED_BACK else None,
            message=p.message,
        )
        history = (*p.history, past)[-MAX_HISTORY:]
        return RolloutController(spec, RolloutProgress(history=history))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form of the whole controller (spec and progress)."""
        return {
            "schema": SCHEMA_VERSION,
            "spec": self.spec.model_dump(mode="json"),
            "progress": self._progress.model_dump(mode="json"),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutController:
        """Inverse of ``to_dict``; raises ``ValueError`` on malformed or foreign data."""
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"unsupported rollout schema {data.get('schema')!r}")
        spec = RolloutSpec.model_validate(data["spec"])
        return cls(spec, RolloutProgress.model_validate(data["progress"]))

    def to_json(self) -> bytes:
        """``to_dict`` as compact UTF-8 JSON, for ``store.put_blob``."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> RolloutController:
        """Inverse of ``to_json``."""
        return cls.from_dict(json.loads(data))

    # -- internals -----------------------------------------------------------

    def _require(self, allowed: set[RolloutState], action: str) -> None:
        state = self._progress.state
        if state not in allowed:
            names = " or ".join(sorted(s.value for s in allowed))
            raise InvalidTransitionError(
                f"cannot {action}: rollout {self.spec.rollout_id} is {state.value}, not {names}"
            )

    def _set(
        self,
        progress: RolloutProgress,
        reason: str,
        gates: tuple[GateResult, ...],
        *,
        alert: Alert | None = None,
        changed: bool = False,
        promote: bool = False,
    ) -> RolloutUpdate:
        self._progress = progress
        return RolloutUpdate(
            state=progress.state,
            reason=reason,
            weights=self.weights(),
            step_index=progress.step_index,
            gates=gates,
            alert=alert,
            promote=promote,
            changed=changed,
        )

    def _finish(
        self,
        now: Seconds,
        progress: RolloutProgress,
        state: RolloutState,
        *,
        why: str,
        gate: GateResult | None = None,
        gates: tuple[GateResult, ...] = (),
    ) -> RolloutUpdate:
        verb, reason, canary_weight = _FINAL[state]
        alert = self._alert(reason, f"rollout {verb}: {why}", gate)
        done = progress.model_copy(
            update={
                "state": state,
                "pause_reason": None,
                "canary_weight": canary_weight,
                "finished_at": now,
                "message": why,
            }
        )
        return self._set(
            done,
            state.value,
            gates,
            alert=alert,
            changed=True,
            promote=state is RolloutState.PROMOTED,
        )

    def _alert(
        self,
        reason: AlertReason,
        message: str,
        gate: GateResult | None = None,
    ) -> Alert:
        p, spec = self._progress, self.spec
        return Alert(
            rollout=spec.rollout_id,
            reason=reason,
            gate=gate.name if gate else None,
            observed=gate.observed if gate else None,
            bound=gate.bound if gate else None,
            step=p.step_index + 1,
            weight=p.canary_weight,
            message=(
                f"{spec.rollout_id} ({spec.baseline} -> {spec.canary}) at step "
                f"{p.step_index + 1}/{len(spec.steps)}, "
                f"canary {fmt_num(p.canary_weight)}%: {message}"
            ),
        )
