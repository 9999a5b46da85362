"""``request_features`` makes the same value as ``RequestFeatures``'s own constructor."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from kvgate.core.features import RequestFeatures, request_features
from kvgate.types import BlockHash, Priority, SessionKey, SessionSource


def test_the_fast_constructor_takes_every_field_with_its_default() -> None:
    params = inspect.signature(request_features).parameters
    fields = dataclasses.fields(RequestFeatures)
    assert list(params) == [f.name for f in fields]
    for f in fields:
        if f.default_factory is not dataclasses.MISSING:
            assert params[f.name].default == f.default_factory()
            continue
        assert params[f.name].default == (
            inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        )


def test_no_enum_member_is_a_class_default() -> None:
    # A class attribute of a mutable type (an Enum member) keeps CPython 3.11 from
    # specializing reads of the instance's field by that name.
    for name in ("priority", "session_source"):
        assert name not in vars(RequestFeatures)


def test_the_fast_constructor_makes_an_equal_frozen_value() -> None:
    given = {
        "request_id": "r1",
        "model": "m",
        "session_key": SessionKey("s"),
        "session_source": SessionSource.HEADER,
        "prefix_hashes": (BlockHash(1), BlockHash(2)),
        "prompt_pieces": ("ab",),
        "prompt_chars": 2,
        "priority": Priority.CRITICAL,
        "pinned_version": "v2",
        "stream": True,
        "max_tokens": 7,
        "checkpoints": (1,),
        "restorable_blocks": 3,
    }
    fast, slow = request_features(**given), RequestFeatures(**given)  # type: ignore[arg-type]
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert request_features("r", "m") == RequestFeatures("r", "m")
    assert dataclasses.replace(fast, model="n") == dataclasses.replace(slow, model="n")
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.model = "x"  # type: ignore[misc]


def test_the_fast_decision_and_place_equal_the_constructed_ones() -> None:
    import random

    from kvgate.core.admission import AdmissionConfig
    from kvgate.core.decision import AffinityWrite, Decision, decision_for
    from kvgate.core.fleet import FleetSnapshot, WorkerState
    from kvgate.core.policies import default_registry
    from kvgate.core.route import Place, RouteConfig, route

    write = AffinityWrite(SessionKey("s"), "w", "v1", expected=None)
    fast = decision_for("w", "prefix_match", "v1", write, 12)
    slow = Decision(
        worker="w", reason="prefix_match", version="v1", affinity=write, shared_chars=12
    )
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    fleet = FleetSnapshot(0.0, (WorkerState(id="w", model="m", max_in_flight=4),))
    verdict = route(
        request_features("r", "m", session_key=SessionKey("s")),
        None,
        fleet,
        default_registry().build("round_robin"),
        random.Random(0),
        queue_depth=0,
        held_s=None,
        config=RouteConfig(AdmissionConfig()),
    )
    assert isinstance(verdict, Place)
    assert verdict == Place(verdict.worker, verdict.reason, verdict.version, verdict.affinity, 0)
    assert (verdict.worker, verdict.reason) == ("w", "round_robin")
