"""Passive outlier detection (Envoy) and active health-check state (HAProxy).

Both are pure state machines fed by the driver with injected time: the gateway
calls ``record_success``/``record_failure`` on live responses and
``record_probe``/``probe_succeeded`` on health probes, then reads
``is_ejected``/``is_healthy`` when it builds the fleet snapshot.

``OutlierDetector`` follows Envoy's consecutive-5xx detector without its timer:

- ``consecutive_failures`` failures in a row (no success between) eject a worker.
- The ejection lasts ``base_ejection_s × n`` (``n`` = that worker's ejection
  multiplier, raised by one per ejection), capped at ``max_ejection_s``. As in
  Envoy, the multiplier falls back by one for each ``max_ejection_s`` the worker
  then stays in service, so a flap last week does not cost five minutes today.
- Share cap, per pool (the workers of one model, Envoy's cluster): an ejection
  that would put more than ``max_ejected_fraction`` of the pool out is refused,
  except that one worker may always be ejected when the pool has at least two
  (Envoy's ``always_eject_one_host``; with the 10% default a pool under ten could
  otherwise never eject anything). The last worker in service of a pool is never
  ejected: its model would have nowhere left to go. A refused ejection keeps the
  failure count, so the next failure tries again once there is room.
- Only failures that are the worker's are counted (``blame``): an error answer
  that another worker repeated for the same request is the request's, and one
  that nobody else was asked about (no retry was possible) proves nothing, so
  neither ejects a worker that serves everyone else.
- Return: a worker comes back when its ejection time has run out (checked
  lazily, no interval timer), or earlier when an active probe passes after it
  has been out at least ``probe_readmit_after_s``. The floor keeps a worker
  whose ``/health`` passes while it fails real requests from flapping straight
  back in.

Example config::

    outlier:
      consecutive_failures: 5
      base_ejection_s: 30
      max_ejection_s: 300
      max_ejected_fraction: 0.1
      probe_readmit_after_s: 10

``HealthTracker`` is HAProxy's ``fall``/``rise``: ``fall`` failed probes in a row
take a healthy worker down, ``rise`` passed probes in a row bring it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from kvgate.types import Seconds, WorkerId


class OutlierConfig(BaseModel):
    """Outlier detection settings; defaults are Envoy's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    consecutive_failures: int = Field(default=5, ge=1)
    base_ejection_s: float = Field(default=30.0, gt=0)
    max_ejection_s: float = Field(default=300.0, gt=0)
    max_ejected_fraction: float = Field(default=0.1, ge=0, le=1)
    always_eject_one: bool = True
    probe_readmit_after_s: float = Field(default=10.0, ge=0)


class Blame(StrEnum):
    """Whose fault one request's failed attempts were, as far as a second opinion tells."""

    WORKER = "worker"
    """Another worker served it, or the workers failed it differently: charge them."""
    REQUEST = "request"
    """Two workers answered it with the same error: the request's doing, charge none."""
    UNKNOWN = "unknown"
    """One error answer and no second opinion (no retry was possible): charge none."""


def blame(statuses: Sequence[int], *, served: bool) -> Blame:
    """Who is at fault for a request's error answers (``statuses``, 5xx, in order).

    ``served``: another worker then answered it without a server error. A worker is
    charged only when the second opinion clears the request; without one the
    failure cannot be told from a client's poison input sent many times at once
    (each un-retried copy would otherwise eject a healthy worker).
    """
    if served:
        return Blame.WORKER
    if len(set(statuses)) < len(statuses):
        return Blame.REQUEST
    if len(statuses) < 2:
        return Blame.UNKNOWN
    return Blame.WORKER


@dataclass(slots=True)
class _OutlierState:
    """What the detector remembers about one worker."""

    pool: str = ""
    failures: int = 0
    ejections: int = 0
    multiplier: int = 0
    ejected_at: Seconds | None = None
    ejected_until: Seconds | None = None
    # When the multiplier last changed or the worker last came back; decay runs from here.
    decay_from: Seconds = 0.0


class OutlierDetector:
    """Ejects workers that fail consecutively; see the module docstring for the rules."""

    def __init__(self, config: OutlierConfig | None = None) -> None:
        self.config = config or OutlierConfig()
        self._workers: dict[WorkerId, _OutlierState] = {}

    def set_workers(
        self, workers: Iterable[WorkerId], pools: Mapping[WorkerId, str] | None = None
    ) -> None:
        """Make the fleet exactly ``workers``; forget others.

        ``pools`` names each worker's pool (its model): the share cap counts a pool.
        Workers it leaves out keep the pool they had (new ones: the pool ``""``).
        """
        wanted = set(workers)
        for gone in set(self._workers) - wanted:
            del self._workers[gone]
        for worker in wanted:
            state = self._workers.setdefault(worker, _OutlierState())
            if pools is not None and worker in pools:
                state.pool = pools[worker]

    def forget(self, worker: WorkerId) -> None:
        """``worker`` left the fleet."""
        self._workers.pop(worker, None)

    def record_success(self, worker: WorkerId, now: Seconds) -> None:
        """A live request to ``worker`` succeeded: its failure streak ends."""
        state = self._state(worker, now)
        state.failures = 0

    def record_failure(self, worker: WorkerId, now: Seconds) -> bool:
        """A live request to ``worker`` failed (5xx, reset, timeout).

        Returns True when this failure newly ejected the worker.
        """
        state = self._state(worker, now)
        if state.ejected_until is not None:
            return False  # already out; stragglers from before the ejection
        state.failures += 1
        if state.failures < self.config.consecutive_failures or not self._room_to_eject(
            state.pool, now
        ):
            return False
        self._decay(state, now)
        state.multiplier += 1
        state.ejections += 1
        duration = min(self.config.base_ejection_s * state.multiplier, self.config.max_ejection_s)
        state.ejected_at = now
        state.ejected_until = now + duration
        state.failures = 0
        return True

    def probe_succeeded(self, worker: WorkerId, now: Seconds) -> bool:
        """An active probe of ``worker`` passed; returns True when that brought it back."""
        state = self._state(worker, now)
        if state.ejected_at is None:
            return False
        if now - state.ejected_at < self.config.probe_readmit_after_s:
            return False
        self._readmit(state, now)
        return True

    def is_ejected(self, worker: WorkerId, now: Seconds) -> bool:
        """True while ``worker`` is ejected at ``now``."""
        state = self._workers.get(worker)
        if state is None:
            return False
        self._expire(state, now)
        return state.ejected_until is not None

    def ejected(self, now: Seconds) -> frozenset[WorkerId]:
        """Every worker ejected at ``now``."""
        return frozenset(w for w in list(self._workers) if self.is_ejected(w, now))

    def ejected_until(self, worker: WorkerId, now: Seconds) -> Seconds | None:
        """When ``worker``'s current ejection runs out, or ``None`` if it is in service."""
        state = self._workers.get(worker)
        if state is None:
            return None
        self._expire(state, now)
        return state.ejected_until

    def ejection_count(self, worker: WorkerId) -> int:
        """How many times ``worker`` has been ejected since it joined (never decays)."""
        state = self._workers.get(worker)
        return state.ejections if state else 0

    def _state(self, worker: WorkerId, now: Seconds) -> _OutlierState:
        state = self._workers.get(worker)
        if state is None:
            state = self._workers[worker] = _OutlierState(decay_from=now)
        self._expire(state, now)
        return state

    def _expire(self, state: _OutlierState, now: Seconds) -> None:
        if state.ejected_until is not None and now >= state.ejected_until:
            self._readmit(state, state.ejected_until)

    def _readmit(self, state: _OutlierState, at: Seconds) -> None:
        state.ejected_at = None
        state.ejected_until = None
        state.failures = 0
        state.decay_from = at

    def _decay(self, state: _OutlierState, now: Seconds) -> None:
        steps = int((now - state.decay_from) // self.config.max_ejection_s)
        if steps > 0:
            state.multiplier = max(0, state.multiplier - steps)

    def _room_to_eject(self, pool: str, now: Seconds) -> bool:
        members = [w for w, s in self._workers.items() if s.pool == pool]
        size = len(members)
        out = sum(self.is_ejected(w, now) for w in members)
        if out + 1 >= size:
            return False  # never the pool's last worker in service
        if (out + 1) <= self.config.max_ejected_fraction * size:
            return True
        return self.config.always_eject_one and out == 0


class Transition(StrEnum):
    """A change of a worker's active-check health."""

    UP = "up"
    DOWN = "down"


class HealthCheckConfig(BaseModel):
    """Active health-check thresholds; defaults are HAProxy's ``fall 3 rise 2``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fall: int = Field(default=3, ge=1)
    rise: int = Field(default=2, ge=1)
    initially_healthy: bool = True


@dataclass(slots=True)
class _HealthState:
    healthy: bool
    streak: int = 0  # probes in a row that disagree with ``healthy``
    since: Seconds = 0.0


class HealthTracker:
    """Up/down state per worker from active probes, with ``fall``/``rise`` damping."""

    def __init__(self, config: HealthCheckConfig | None = None) -> None:
        self.config = config or HealthCheckConfig()
        self._workers: dict[WorkerId, _HealthState] = {}

    def record_probe(self, worker: WorkerId, ok: bool, now: Seconds) -> Transition | None:
        """Record one probe result; returns the transition it caused, if any."""
        state = self._workers.get(worker)
        if state is None:
            state = self._workers[worker] = _HealthState(
                healthy=self.config.initially_healthy, since=now
            )
        if ok == state.healthy:
            state.streak = 0
            return None
        state.streak += 1
        needed = self.config.rise if ok else self.config.fall
        if state.streak < needed:
            return None
        state.healthy = ok
        state.streak = 0
        state.since = now
        return Transition.UP if ok else Transition.DOWN

    def is_healthy(self, worker: WorkerId) -> bool:
        """True unless probes have taken ``worker`` down (unknown workers use the default)."""
        state = self._workers.get(worker)
        return state.healthy if state else self.config.initially_healthy

    def since(self, worker: WorkerId) -> Seconds | None:
        """When ``worker`` entered its current state (first probe or last transition)."""
        state = self._workers.get(worker)
        return state.since if state else None

    def forget(self, worker: WorkerId) -> None:
        """``worker`` left the fleet."""
        self._workers.pop(worker, None)
