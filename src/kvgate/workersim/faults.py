"""Fault injection: the failures a worker-sim can be told to show.

Set at start-up from ``WorkerOptions`` and at run time by ``POST /admin/faults``
with a partial JSON object (fields left out keep their value), e.g.
``{"error_rate": 0.2, "close_mid_stream_after": 3}``; ``GET /admin/faults`` reads
them. Faults apply to the completion endpoints only, so health checks, metrics
and the admin API stay reachable to observe and undo them.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class FaultSettings(BaseModel):
    """The active faults.

    - ``error_rate``: probability that a request is answered with HTTP 500.
    - ``extra_latency_ms``: added before the first byte of every answer.
    - ``hang``: accept requests and never answer them.
    - ``close_mid_stream_after``: drop a streaming connection after this many
      chunks (``None``: never).
    - ``refuse_connections``: close every connection as soon as it sends a request,
      without an answer.
    - ``speed``: the engine's speed as a share of its profile's (0.5: every step takes
      twice as long, a GPU throttled or shared with a noisy neighbour).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    extra_latency_ms: float = Field(default=0.0, ge=0.0)
    hang: bool = False
    close_mid_stream_after: int | None = Field(default=None, ge=0)
    refuse_connections: bool = False
    speed: float = Field(default=1.0, gt=0.0, le=100.0)


class FaultUpdate(BaseModel):
    """A partial ``FaultSettings``: the body of ``POST /admin/faults``."""

    model_config = ConfigDict(extra="forbid")

    error_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    extra_latency_ms: float | None = Field(default=None, ge=0.0)
    hang: bool | None = None
    close_mid_stream_after: int | None = Field(default=None, ge=0)
    refuse_connections: bool | None = None
    speed: float | None = Field(default=None, gt=0.0, le=100.0)


class FaultInjector:
    """The faults in force, with a seeded random source for ``error_rate``."""

    def __init__(self, settings: FaultSettings, seed: int = 0) -> None:
        self.settings = settings
        self._rng = random.Random(seed)
        self.injected: Counter[str] = Counter()

    def update(self, update: FaultUpdate) -> FaultSettings:
        """Apply the fields ``update`` sets explicitly and return the result."""
        changes: dict[str, Any] = update.model_dump(exclude_unset=True)
        merged = self.settings.model_dump() | changes
        self.settings = FaultSettings.model_validate(merged)
        return self.settings

    def draw_error(self) -> bool:
        """True when this request should fail with HTTP 500 (counts it)."""
        rate = self.settings.error_rate
        if rate <= 0.0:
            return False
        if self._rng.random() < rate:
            self.injected["error"] += 1
            return True
        return False

    def note(self, fault: str) -> None:
        """Count one injected fault of kind ``fault`` (a metric label)."""
        self.injected[fault] += 1
