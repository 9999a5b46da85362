"""Model versions and version assignment: weights, determinism, stickiness, pinning."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from kvgate.core.versions import (
    AssignReason,
    InvalidVersionError,
    ModelVersions,
    UnknownVersionError,
    VersionWeights,
    assign_version,
)


def two_versions(canary_weight: float, model: str = "llama") -> ModelVersions:
    """``v1`` (stable) and ``v2`` at ``canary_weight`` percent."""
    return ModelVersions(
        model, VersionWeights({"v1": 100.0 - canary_weight, "v2": canary_weight}), "v1"
    )


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({}, "at least one version"),
        ({"v1": -1.0, "v2": 2.0}, "must be finite and >= 0"),
        ({"v1": float("nan")}, "must be finite"),
        ({"v1": float("inf")}, "must be finite"),
        ({"v1": 0.0, "v2": 0.0}, "sum to more than 0"),
        ({"": 1.0}, "non-empty"),
        ([("v1", 1.0), ("v1", 2.0)], "listed twice"),
    ],
)
def test_invalid_weights_are_refused(
    weights: dict[str, float] | list[tuple[str, float]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        VersionWeights(weights)


def test_weights_are_canonical_whatever_the_input_order() -> None:
    a = VersionWeights({"v2": 10.0, "v1": 90.0})
    b = VersionWeights([("v1", 90.0), ("v2", 10.0)])
    assert a == b
    assert hash(a) == hash(b)
    assert list(a) == ["v1", "v2"]
    assert a.share("v2") == pytest.approx(0.1)
    assert a.share("missing") == 0.0


@pytest.mark.parametrize(
    ("versions", "stable", "message"),
    [
        ({"v1": 1.0}, "v9", "not a version"),
        ({"v1": 1.0, "v2": 0.0}, "", "not a version"),
    ],
)
def test_model_versions_validates_stable(
    versions: dict[str, float], stable: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ModelVersions("m", VersionWeights(versions), stable)


def test_with_weights_zeroes_unnamed_versions_and_refuses_unknown() -> None:
    mv = ModelVersions("m", VersionWeights({"a": 1.0, "b": 1.0, "c": 1.0}), "a")
    updated = mv.with_weights({"a": 50.0, "b": 50.0})
    assert updated.weights.to_dict() == {"a": 50.0, "b": 50.0, "c": 0.0}
    assert updated.has("c")
    with pytest.raises(ValueError, match="no version"):
        mv.with_weights({"zzz": 1.0})


def test_model_versions_round_trip() -> None:
    mv = two_versions(25.0).with_stable("v2")
    assert ModelVersions.from_dict(mv.to_dict()) == mv


def test_assignment_is_deterministic_across_instances() -> None:
    keys = [f"session-{i}" for i in range(200)]
    first = [assign_version(two_versions(30.0), k, "r") for k in keys]
    # A fresh, equal registry built in another order, as another replica would.
    other = ModelVersions("llama", VersionWeights([("v2", 30.0), ("v1", 70.0)]), "v1")
    second = [assign_version(other, k, "r") for k in keys]
    assert first == second
    assert {a.reason for a in first} == {AssignReason.SESSION_HASH}


@pytest.mark.parametrize("canary_weight", [5.0, 25.0, 50.0, 90.0])
def test_session_split_matches_weights(canary_weight: float) -> None:
    rng = random.Random(7)
    keys = [f"user-{rng.getrandbits(64):x}" for _ in range(20_000)]
    mv = two_versions(canary_weight)
    canary = sum(assign_version(mv, k, "r").version == "v2" for k in keys)
    assert canary / len(keys) == pytest.approx(canary_weight / 100, abs=0.015)


def test_request_without_session_is_split_per_request() -> None:
    mv = two_versions(20.0)
    picks = [assign_version(mv, None, f"req-{i}") for i in range(20_000)]
    share = sum(p.version == "v2" for p in picks) / len(picks)
    assert share == pytest.approx(0.20, abs=0.015)
    assert {p.reason for p in picks} == {AssignReason.REQUEST_HASH}
    # The session key, not the request id, decides for sessions.
    with_key = {assign_version(mv, "s-1", f"req-{i}").version for i in range(50)}
    assert len(with_key) == 1


def test_growing_canary_keeps_its_sessions() -> None:
    # With two versions, a session on the canary at a low weight is still on it
    # at every higher weight: steps only move baseline sessions over.
    keys = [f"k{i}" for i in range(5_000)]
    steps = [5.0, 10.0, 25.0, 50.0, 100.0]
    on_canary = [
        {k for k in keys if assign_version(two_versions(w), k, "r").version == "v2"} for w in steps
    ]
    for smaller, larger in pairwise(on_canary):
        assert smaller <= larger


@pytest.mark.parametrize(
    ("canary_weight", "bound", "expected"),
    [
        (10.0, "v1", ("v1", AssignReason.STICKY)),
        (10.0, "v2", ("v2", AssignReason.STICKY)),
        # A rolled-back canary (weight 0) no longer holds its sessions.
        (0.0, "v2", ("v1", AssignReason.REASSIGNED)),
        # After promotion the old stable version's sessions move too.
        (100.0, "v1", ("v2", AssignReason.REASSIGNED)),
        # A bound version the model no longer has.
        (50.0, "gone", (None, AssignReason.REASSIGNED)),
    ],
)
def test_sticky_sessions_keep_their_version_while_it_takes_traffic(
    canary_weight: float, bound: str, expected: tuple[str | None, AssignReason]
) -> None:
    version, reason = assign_version(two_versions(canary_weight), "s", "r", bound=bound)
    want_version, want_reason = expected
    assert reason is want_reason
    if want_version is not None:
        assert version == want_version
    else:
        assert version in {"v1", "v2"}


@pytest.mark.parametrize(
    ("session_key", "bound", "pinned", "expected"),
    [
        ("s", "v1", "v2", "v2"),  # pin beats stickiness
        (None, None, "v1", "v1"),
        ("s", None, " v2 ", "v2"),  # header whitespace is tolerated
    ],
)
def test_pinned_version_wins(
    session_key: str | None, bound: str | None, pinned: str, expected: str
) -> None:
    assert assign_version(two_versions(0.0), session_key, "r", pinned, bound) == (
        expected,
        AssignReason.PINNED,
    )


@pytest.mark.parametrize(
    ("pinned", "error", "code"),
    [
        ("v9", UnknownVersionError, "model_version_not_found"),
        ("  ", InvalidVersionError, "invalid_model_version"),
    ],
)
def test_bad_pins_raise_errors_with_codes(pinned: str, error: type[Exception], code: str) -> None:
    with pytest.raises(error) as caught:
        assign_version(two_versions(10.0), "s", "r", pinned)
    assert getattr(caught.value, "code", None) == code
    assert getattr(caught.value, "model", None) == "llama"


def test_models_are_hashed_independently() -> None:
    # The same session key should not land in the same share of every model.
    keys = [f"k{i}" for i in range(4_000)]
    a = {k for k in keys if assign_version(two_versions(50.0, "a"), k, "r").version == "v2"}
    b = {k for k in keys if assign_version(two_versions(50.0, "b"), k, "r").version == "v2"}
    overlap = len(a & b) / len(keys)
    assert overlap == pytest.approx(0.25, abs=0.03)
