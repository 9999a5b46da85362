"""``SpeedLearning`` fits a worker's speed to the engine's own TTFT where it reports one."""

from __future__ import annotations

from kvgate.core.features import RequestFeatures
from kvgate.core.policies.learning import Replies, SpeedLearning
from kvgate.core.speed import FleetSpeed, Observation, Speed
from kvgate.types import Seconds, WorkerId


class _Fits(FleetSpeed):
    """A ``FleetSpeed`` that keeps the TTFTs it was fitted to."""

    def __init__(self) -> None:
        super().__init__(Speed(0.0, 1e-4, 0.0))
        self.fitted: list[Seconds | None] = []

    def observed(
        self, request_id: str, ttft: Seconds | None, *, seen: Seconds | None = None
    ) -> None:
        self.fitted.append(ttft)


class _Learner(SpeedLearning):
    def __init__(self, engine_seconds: float) -> None:
        self.speed = _Fits()
        self.engine_seconds = engine_seconds


def test_the_engines_own_ttft_is_read_in_the_drivers_clock_else_the_gateways() -> None:
    policy = _Learner(engine_seconds=10.0)  # an emulated fleet ten times real time
    request, worker = RequestFeatures(request_id="r", model="m"), WorkerId("w")
    policy.on_observed(request, worker, Observation(0.9, 100, 0, engine_ttft=5.0), 1.0)
    policy.on_observed(request, worker, Observation(0.9, 100, 0), 1.0)
    assert policy.speed.fitted == [0.5, 0.9]
    policy.learn = False
    policy.on_observed(request, worker, Observation(0.9, 100, 0, engine_ttft=5.0), 1.0)
    assert policy.speed.fitted == [0.5, 0.9]


def test_a_sessions_last_reply_is_cached_on_its_worker_only() -> None:
    """The next turn re-sends the last reply after the earlier prompt: its worker holds
    both (the engine kept the KV it generated), another worker nothing of it."""
    replies = Replies(limit=2)
    first = RequestFeatures(request_id="t1", model="m", session_key="s", prompt_chars=1_000)
    replies.replied(first, WorkerId("a"), 400)
    later = RequestFeatures(request_id="t2", model="m", session_key="s", prompt_chars=1_600)
    assert replies.cached(later, WorkerId("a")) == 1_400
    assert replies.cached(later, WorkerId("b")) == 0
    short = RequestFeatures(request_id="t3", model="m", session_key="s", prompt_chars=900)
    assert replies.cached(short, WorkerId("a")) == 900  # never more than the prompt
    headerless = RequestFeatures(request_id="h", model="m", prompt_chars=1_600)
    replies.replied(headerless, WorkerId("a"), 400)
    assert replies.cached(headerless, WorkerId("a")) == 0
    for key in ("x", "y"):  # the oldest session is forgotten past the limit
        replies.replied(RequestFeatures(request_id=key, model="m", session_key=key), "a", 1)
    assert replies.cached(later, WorkerId("a")) == 0
