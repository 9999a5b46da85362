"""The live version registry: assignment, run-time changes, and the split seen end to end."""

from __future__ import annotations

from collections import Counter

import aiohttp
import pytest
from multidict import CIMultiDict

from kvgate.core.decision import Affinity
from kvgate.core.features import RequestFeatures
from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.control.config import ModelVersionsConfig
from kvgate.gateway.control.versions import (
    VersionConflictError,
    VersionNotFoundError,
    VersionRegistry,
)
from kvgate.gateway.dataplane.errors import InvalidRequestError, NotFoundError
from kvgate.gateway.dataplane.queue import AdmissionQueue
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.testing import running_gateway
from kvgate.gateway.upstream.transport import Timeouts, Upstream

from .conftest import every_worker_up
from .rollout_fleet import versioned_fleet


def _pool(*versions: str) -> WorkerPool:
    timeouts = Timeouts(connect=1, first_byte=1, total=1)
    workers = [
        Worker(
            WorkerConfig(url=f"http://w{i}:8000", model="demo", version=v),
            Upstream(f"http://w{i}:8000", timeouts),
        )
        for i, v in enumerate(versions)
    ]
    return WorkerPool(workers, 10.0, AdmissionQueue(8))


def _features(
    key: str | None = "s1", pinned: str | None = None, rid: str = "r1"
) -> RequestFeatures:
    return RequestFeatures(request_id=rid, model="demo", session_key=key, pinned_version=pinned)


def _registry(weights: dict[str, float] | None = None) -> VersionRegistry:
    configured = {"demo": ModelVersionsConfig(weights=weights)} if weights else {}
    return VersionRegistry(_pool("v1", "v2"), configured)


def test_an_unsplit_model_is_not_assigned_but_unknown_pins_are_refused() -> None:
    registry = _registry()
    assert registry.assign(_features(), None) is None
    assert registry.assign(_features(pinned="v2"), None) is None  # served: the policy filters
    with pytest.raises(VersionNotFoundError):
        registry.assign(_features(pinned="v9"), None)


def test_sessions_are_assigned_by_weight_and_stick_while_their_version_has_weight() -> None:
    registry = _registry({"v1": 1, "v2": 1})
    keys = [f"s{i}" for i in range(400)]
    split = Counter(registry.assign(_features(k), None) for k in keys)
    assert 150 < split["v2"] < 250
    # Deterministic: the same key gets the same version (every replica agrees).
    assert [registry.assign(_features(k), None) for k in keys[:20]] == [
        registry.assign(_features(k), None) for k in keys[:20]
    ]
    on_v2 = next(k for k in keys if registry.assign(_features(k), None) == "v2")
    bound = Affinity(on_v2, "http://w1:8000", "v2")
    registry.set_weights("demo", {"v2": 0.001})
    assert registry.assign(_features(on_v2), bound) == "v2"
    registry.set_weights("demo", {"v2": 0})
    assert registry.assign(_features(on_v2), bound) == "v1"  # reassigned after the rollback
    assert registry.assign(_features(on_v2, pinned="v2"), bound) == "v2"
    # Without a session key each request is hashed on its own id.
    per_request = Counter(registry.assign(_features(None, rid=f"r{i}"), None) for i in range(50))
    assert per_request == Counter({"v1": 50})


def test_changes_validate_names_and_protect_the_stable_version() -> None:
    registry = _registry()
    seen: list[tuple[object, object]] = []
    registry.subscribe(lambda old, new: seen.append((old, new)))
    split = registry.set_weights("demo", {"v2": 3})
    assert split.weights.to_dict() == {"v1": 0.0, "v2": 3.0}
    assert split.stable == "v2"
    assert len(seen) == 1
    with pytest.raises(VersionNotFoundError):
        registry.set_weights("demo", {"v3": 1})
    with pytest.raises(NotFoundError):
        registry.set_weights("other", {"v1": 1})
    with pytest.raises(InvalidRequestError):
        registry.set_weights("demo", {"v2": 0})  # nothing left with weight
    assert registry.add_version("demo", "v3").weights["v3"] == 0.0
    with pytest.raises(VersionConflictError):
        registry.add_version("demo", "v3")
    with pytest.raises(VersionConflictError):
        registry.remove_version("demo", "v2")  # stable
    assert set(registry.remove_version("demo", "v3").versions) == {"v1", "v2"}
    assert registry.set_stable("demo", "v1").stable == "v1"
    assert registry.known_versions("demo") == {"v1", "v2"}
    described = registry.describe()["demo"]
    assert isinstance(described, dict)
    assert described["workers"] == {"v1": ["http://w0:8000"], "v2": ["http://w1:8000"]}


async def test_a_split_model_serves_both_versions_and_says_which() -> None:
    async with versioned_fleet() as fleet:
        config = fleet.config(models={"demo": {"weights": {"v1": 1, "v2": 1}}})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await every_worker_up(gw)
            served: Counter[tuple[str, str]] = Counter()
            for i in range(40):
                body = {"model": "demo", "prompt": f"prompt {i}", "max_tokens": 2}
                async with session.post(gw.url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    served[
                        resp.headers["X-Kvgate-Model-Version"], resp.headers["X-Kvgate-Worker"]
                    ] += 1
            # Each version was served, and only by its own workers.
            assert {v for v, _ in served} == {"v1", "v2"}
            assert {w for v, w in served if v == "v2"} == {fleet.canary[0].url}
            text = gw.gateway.metrics.render().decode()
            assert 'kvgate_version_weight_percent{model="demo",version="v2"} 50.0' in text
            assert 'kvgate_version_attempts_total{model="demo",outcome="ok",version="v2"}' in text


async def test_the_version_pin_header_can_be_disabled() -> None:
    async with versioned_fleet() as fleet:
        config = fleet.config(features={"allow_version_pin": False})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            body = {"model": "demo", "prompt": "hi", "max_tokens": 2}
            async with session.post(
                gw.url + "/v1/completions", json=body, headers={"X-Model-Version": "v2"}
            ) as resp:
                assert resp.status == 200
                assert resp.headers["X-Kvgate-Model-Version"] == "v1"


async def test_a_clients_version_pin_is_believed_only_where_the_operator_allows() -> None:
    """``X-Model-Version`` is any client's to send: with client API keys (several tenants)
    a client pinned itself onto the canary at weight 0. Now only ``client_hints`` says whose
    pin is believed: by default nobody's once there are keys; a trusted hop's, sent once."""
    keys = ["sk-tenant-0123456789"]
    key = {"Authorization": f"Bearer {keys[0]}"}
    hop = {"client_hints": {"trusted_peers": ["127.0.0.0/8", "::1"]}}
    cases = [
        ({"api_keys": keys}, [("X-Model-Version", "v2")], "v1"),
        ({"api_keys": keys}, [("x-model-version", "v2")], "v1"),
        (
            {"api_keys": keys, "features": hop},
            [("X-MODEL-VERSION", "v2")],
            "v2",
        ),
        (  # the client's beside the hop's: no pin believed
            {"api_keys": keys, "features": hop},
            [("X-Model-Version", "v2"), ("X-Model-Version", "v2")],
            "v1",
        ),
        ({"features": {"client_hints": "none"}}, [("X-Model-Version", "v2")], "v1"),
        ({}, [("X-Model-Version", "v2")], "v2"),  # one tenant, no keys: believed
    ]
    async with versioned_fleet() as fleet:
        for overrides, pins, served in cases:
            async with (
                running_gateway(fleet.config(**overrides)) as gw,
                aiohttp.ClientSession() as session,
            ):
                await every_worker_up(gw)
                headers = CIMultiDict([*key.items(), *pins])
                body = {"model": "demo", "prompt": "hi", "max_tokens": 2}
                async with session.post(
                    gw.url + "/v1/completions", json=body, headers=headers
                ) as resp:
                    assert resp.status == 200
                    assert resp.headers["X-Kvgate-Model-Version"] == served, (overrides, pins)


async def test_every_endpoint_takes_the_operators_priority() -> None:
    """Requests that are not generations (responses, embeddings, any ``/v1/`` path) were
    all ``standard`` whatever ``default_priority`` said: with ``sheddable`` the default, a
    tenant dodged shedding by asking through ``/v1/responses``. They read it as chat does."""
    from aiohttp.test_utils import make_mocked_request

    from kvgate.types import Priority

    features = {"default_priority": "sheddable"}
    async with versioned_fleet() as fleet:
        for overrides, priority in (
            ({"api_keys": ["sk-tenant-0123456789"]}, Priority.SHEDDABLE),  # not believed
            ({}, Priority.CRITICAL),  # one tenant: the client's
        ):
            config = fleet.config(features=features, **overrides)
            async with running_gateway(config) as gw:
                await every_worker_up(gw)
                for path in ("/v1/responses", "/v1/embeddings"):
                    request = make_mocked_request("POST", path, {"X-Priority": "critical"})
                    body = b'{"model":"demo","input":"hi"}'
                    forward = gw.gateway.passthrough.describe(body, request, "r")
                    assert forward.features.priority is priority, (overrides, path)
