"""``SpeedLearning``: a policy's hooks that keep a ``core.speed.FleetSpeed`` fed.

A base for policies that learn each worker's speed from what the drivers measure of every
attempt (``Policy.on_first_token``, ``Policy.on_observed``) and report it (``speeds``: the
learned rates and the TTFT prediction error ``/metrics`` and the dashboard show). The
policy books each request it routes (``FleetSpeed.sent``) and closes it on its usage
(``FleetSpeed.ended``) or drop (``FleetSpeed.dropped``), where it knows its uncached tokens.
``Replies``: a session's last reply, cached on its worker though the index never saw it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from kvgate.core.features import RequestFeatures
from kvgate.core.policy import PolicyBase
from kvgate.core.speed import FleetSpeed, Observation, SpeedReport
from kvgate.types import Seconds, SessionKey, WorkerId


class Replies:
    """Where each session's last turn ended: its worker and the characters through its reply.

    An engine keeps the KV of what it generated, and a session's next turn re-sends the
    reply after its earlier prompt: cached there, though the index (built from prompts)
    never saw it. Counted, session-docs' later turns were predicted hundreds of tokens
    uncached that took ~1.5 ms (TTFT prediction error 92%). The last ``limit`` sessions.
    """

    __slots__ = ("_ends", "limit")

    def __init__(self, limit: int = 65_536) -> None:
        self.limit = limit
        self._ends: OrderedDict[SessionKey, tuple[WorkerId, int]] = OrderedDict()

    def cached(self, request: RequestFeatures, worker: WorkerId) -> int:
        """Characters of ``request``'s prompt ``worker`` holds through its session's last
        reply (0: no session, or its last turn went elsewhere)."""
        key = request.session_key
        end = self._ends.get(key) if key is not None else None
        if end is None or end[0] != worker:
            return 0
        return min(end[1], request.prompt_chars)

    def replied(self, request: RequestFeatures, worker: WorkerId, chars: int) -> None:
        """``request``'s turn on ``worker`` ended with a reply of ``chars`` characters."""
        key = request.session_key
        if key is None:
            return
        ends = self._ends
        ends[key] = (worker, request.prompt_chars + chars)
        ends.move_to_end(key)
        if len(ends) > self.limit:
            ends.popitem(last=False)


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
            if engine is None:
                self.speed.observed(request.request_id, observed.ttft)
            else:
                ttft, seen = engine / self.engine_seconds, observed.ttft
                self.speed.observed(request.request_id, ttft, seen=seen)
        if observed.itl is not None and observed.completion_tokens > 1:
            # How long it decoded: with its prefill, how long it held an engine slot.
            decoded = observed.itl * (observed.completion_tokens - 1)
            self.speed.held(request.request_id, decoded)

    def speeds(self) -> Mapping[WorkerId, SpeedReport]:
        """Each worker's learned speed and TTFT prediction error (``core.speed``)."""
        return self.speed.report()
