"""``SpeedLearning``: a policy's hooks that keep a ``core.speed.FleetSpeed`` fed.

A base for policies that learn each worker's speed from what the drivers measure of every
attempt (``Policy.on_first_token``, ``Policy.on_observed``) and report it (``speeds``: the
learned rates and the TTFT prediction error ``/metrics`` and the dashboard show). The
policy books each request it routes (``FleetSpeed.sent``) and closes it on its usage
(``FleetSpeed.ended``) or drop (``FleetSpeed.dropped``), where it knows its uncached tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvgate.core.features import RequestFeatures
from kvgate.core.policy import PolicyBase
from kvgate.core.speed import FleetSpeed, Observation, SpeedReport
from kvgate.types import Seconds, WorkerId


class SpeedLearning(PolicyBase):
    """Feeds ``speed`` the first tokens and TTFTs the drivers observe."""

    speed: FleetSpeed
    learn: bool = True
    """Whether observed TTFTs move the fit (off: the prior stands, the book is still kept)."""
    engine_seconds: float = 1.0
    """The engine's seconds per driver second (an emulated fleet's time scale): an engine's
    own TTFT, where it reports one, is read in the driver's clock through it."""

    def on_first_token(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        """Its prefill is done: it no longer queues ahead of others."""
        self.speed.first_token(request.request_id, now)

    def on_observed(
        self, request: RequestFeatures, worker: WorkerId, observed: Observation, now: Seconds
    ) -> None:
        """Fit ``worker``'s speed to the attempt's TTFT: the engine's own where it reports
        one (the worker's speed, without the network's and the gateway machine's time),
        else the gateway's, from the send."""
        if self.learn:
            engine = observed.engine_ttft
            ttft = engine / self.engine_seconds if engine is not None else observed.ttft
            self.speed.observed(request.request_id, ttft)
        if observed.itl is not None and observed.completion_tokens > 1:
            # How long it decoded: with its prefill, how long it held an engine slot.
            decoded = observed.itl * (observed.completion_tokens - 1)
            self.speed.held(request.request_id, decoded)

    def speeds(self) -> Mapping[WorkerId, SpeedReport]:
        """Each worker's learned speed and TTFT prediction error (``core.speed``)."""
        return self.speed.report()
