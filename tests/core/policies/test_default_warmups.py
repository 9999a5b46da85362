"""``default``'s warm-ups on tables of fleet states: a shared prefix is copied ahead
only where the next opening behind it would copy it, and only onto an idle worker."""

from __future__ import annotations

import random

import pytest

from kvgate.core.fleet import FleetSnapshot, WorkerState
from kvgate.core.policies.default import DefaultConfig, DefaultPolicy
from kvgate.core.policy import RouteContext
from kvgate.core.prefix import build_features
from kvgate.types import WorkerId

SYSTEM = {"role": "system", "content": "You follow the house style. " * 160}  # ~4.5k chars


def opening(rid: str, question: str) -> object:
    body = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": question * 20}]}
    return build_features(body, {}, request_id=rid)


def ctx(now: float, busy: dict[str, int]) -> RouteContext:
    workers = tuple(
        WorkerState(id=WorkerId(w), model="m", in_flight=busy.get(w, 0), kv_usage=0.1)
        for w in ("a", "b", "c")
    )
    return RouteContext(FleetSnapshot(now, workers), None, random.Random(0))


def route_on(policy: DefaultPolicy, features: object, now: float, busy: dict[str, int]) -> str:
    decision = policy.pick(features, ctx(now, busy))  # type: ignore[arg-type]
    assert decision.worker is not None
    policy.on_routed(features, decision.worker, now)  # type: ignore[arg-type]
    return decision.worker


@pytest.mark.parametrize(
    ("warm_min_blocks", "matched", "busy_after", "expect"),
    [
        (4, 2, {}, "idle worker warmed"),  # the holder's queue sends the next opening away
        (0, 2, {}, "off"),  # the option off: never
        (4, 2, {"b": 1, "c": 1}, "no idle worker"),  # the copy would delay what runs there
        # One opening matched it: as likely one conversation's own history as shared.
        (4, 1, {}, "not shared yet"),
    ],
)
def test_a_busy_holder_gets_its_prefix_copied_ahead(
    warm_min_blocks: int, matched: int, busy_after: dict[str, int], expect: str
) -> None:
    policy = DefaultPolicy(DefaultConfig(warm_min_blocks=warm_min_blocks))
    first = route_on(policy, opening("o1", "first question "), 0.0, {})
    # Later openings behind the same system prompt find it on the first's worker.
    for n, question in enumerate(("second question ", "third question ")[:matched]):
        later = route_on(policy, opening(f"o{n + 2}", question), 0.001 * (n + 1), {first: 1})
        assert later == first
    # Long unrelated work queued there since: seconds of prefill ahead of any opening.
    for i in range(3):
        backlog = build_features(
            {"model": "m", "prompt": f"{i} unrelated " * 4000}, {}, request_id=f"u{i}"
        )
        policy.on_routed(backlog, WorkerId(first), 0.001)
    busy = {first: 5, **busy_after}
    warm = policy.warm_up(WorkerId(first), ctx(0.002, busy))
    if expect != "idle worker warmed":
        assert warm is None
        return
    assert warm is not None
    assert warm.worker != first and busy.get(warm.worker, 0) == 0
    assert warm.opener == "o2" and warm.features.request_id.startswith("o2~warm")
    assert 0 < warm.features.prompt_chars <= len(SYSTEM["content"]) + 10
    assert warm.opener in policy.openers()
    # Sent: the index holds the prefix there, so the next opening need not copy it.
    policy.on_warm(warm.features, warm.worker, 0.002)
    fourth = opening("o4", "fourth question ")
    assert policy.residency.matches(fourth, ctx(0.003, busy)).get(warm.worker, 0) > 0  # type: ignore[arg-type]
    policy.on_warm_done(warm.features, warm.worker, 1_100, 0, 0.2)
    assert policy.queued_tokens(warm.worker, 0.2) == 0.0


def test_a_holder_with_room_keeps_the_next_opening_and_nothing_is_warmed() -> None:
    policy = DefaultPolicy(DefaultConfig(warm_min_blocks=4))
    first = route_on(policy, opening("o1", "first question "), 0.0, {})
    route_on(policy, opening("o2", "second question "), 5.0, {})
    # Long after, the holder's queue is empty: the next opening goes there, no copy.
    assert policy.warm_up(WorkerId(first), ctx(10.0, {})) is None
