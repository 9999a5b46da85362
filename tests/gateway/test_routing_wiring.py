"""How the live gateway drives a stateful policy: affinity under the affinity key,
touches on hits, routing and usage feedback (streams included), block sizes."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from kvgate.core.decision import Affinity
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.default import DefaultPolicy
from kvgate.core.prefix import FeatureConfig, build_features
from kvgate.gateway.config import ConfigError, parse_config
from kvgate.gateway.testing import running_gateway
from kvgate.store import MemoryStore
from kvgate.testing import wait_until
from kvgate.types import Seconds, SessionKey, WorkerId
from kvgate.workersim.runner import WorkerHandle

from .conftest import gateway_config

SYSTEM = {"role": "system", "content": "You are a terse assistant. " * 40}
FIRST = {"role": "user", "content": "Summarise the history of paged attention. " * 8}
TURN_2 = [SYSTEM, FIRST, {"role": "assistant", "content": "It pages KV."}]


class SpyPolicy(DefaultPolicy):
    """The default policy, recording the hooks the driver calls."""

    def __init__(self) -> None:
        super().__init__()
        self.routed: list[tuple[str, WorkerId]] = []
        self.usage: list[tuple[str, WorkerId, int, int]] = []
        self.completions: dict[str, int] = {}

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: Seconds) -> None:
        self.routed.append((request.request_id, worker))
        super().on_routed(request, worker, now)

    def on_usage(
        self,
        request: RequestFeatures,
        worker: WorkerId,
        prompt_tokens: int,
        cached_tokens: int,
        now: Seconds,
        *,
        completion_tokens: int = 0,
    ) -> None:
        self.usage.append((request.request_id, worker, prompt_tokens, cached_tokens))
        self.completions[request.request_id] = completion_tokens
        super().on_usage(
            request, worker, prompt_tokens, cached_tokens, now, completion_tokens=completion_tokens
        )


class SpyStore(MemoryStore):
    """A memory store recording the keys it was asked to touch."""

    def __init__(self) -> None:
        super().__init__()
        self.touched: list[SessionKey] = []

    async def touch(self, key: SessionKey, now: Seconds, ttl: Seconds) -> Affinity | None:
        self.touched.append(key)
        return await super().touch(key, now, ttl)


async def chat(
    session: aiohttp.ClientSession,
    base: str,
    messages: list[dict[str, str]],
    *,
    request_id: str,
    stream: bool = False,
    **extra: Any,
) -> tuple[dict[str, str], bytes]:
    """POST a chat completion; the response headers and raw body."""
    body = {"model": "demo", "messages": messages, "max_tokens": 4, "stream": stream, **extra}
    async with session.post(
        base + "/chat/completions", json=body, headers={"X-Request-ID": request_id}
    ) as resp:
        assert resp.status == 200, await resp.text()
        return dict(resp.headers), await resp.read()


def events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON payloads of an SSE body (``[DONE]`` left out)."""
    out = []
    for block in raw.decode().split("\n\n"):
        data = block.removeprefix("data: ").strip()
        if data and data != "[DONE]":
            out.append(json.loads(data))
    return out


async def test_a_headerless_second_turn_finds_its_worker_through_another_replica(
    workers: list[WorkerHandle],
) -> None:
    """Replica B never saw turn 1; the store's prefix holders tell it where A sent it.

    No key is derived from the text: nothing is bound, and B's own index is empty,
    so ``prefix_match`` on B can only come from the shared prefix state.
    """
    store = SpyStore()
    policy_a, policy_b = SpyPolicy(), SpyPolicy()
    async with (
        running_gateway(gateway_config(workers), store=store, policy=policy_a) as replica_a,
        running_gateway(gateway_config(workers), store=store, policy=policy_b) as replica_b,
        aiohttp.ClientSession() as session,
    ):
        first, _ = await chat(session, replica_a.openai_base, [SYSTEM, FIRST], request_id="t1")
        features = build_features(
            {"model": "demo", "messages": [SYSTEM, FIRST]}, {}, request_id="k"
        )
        assert features.affinity_key is None
        assert len(store) == 0  # no session binding was written
        assert len(store.holders) == len(features.checkpoints)
        assert len(policy_b.index) == 0

        second, raw = await chat(
            session,
            replica_b.openai_base,
            [*TURN_2, {"role": "user", "content": "And prefix caching?"}],
            request_id="t2",
        )
    assert second["X-Kvgate-Route-Reason"] == "prefix_match"
    assert second["X-Kvgate-Worker"] == first["X-Kvgate-Worker"]
    assert json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # One request on B, under the gateway's own id (the client's "t2" keys no book).
    assert len(policy_b.routed) == 1 and policy_b.routed[0][0] not in ("t1", "t2")
    assert store.touched == []


async def test_streams_give_cache_feedback_without_showing_usage_the_client_did_not_ask(
    workers: list[WorkerHandle],
) -> None:
    policy = SpyPolicy()
    async with (
        running_gateway(gateway_config(workers), policy=policy) as gw,
        aiohttp.ClientSession() as session,
    ):
        _, plain = await chat(
            session, gw.openai_base, [SYSTEM, FIRST], request_id="s1", stream=True
        )
        _, asked = await chat(
            session,
            gw.openai_base,
            [SYSTEM, FIRST],
            request_id="s2",
            stream=True,
            stream_options={"include_usage": True},
        )
        await wait_until(lambda: len(policy.usage) == 2, message="usage of both streams")
        metrics = gw.gateway.metrics.render().decode()
    # The client that did not ask sees no usage at all, and its stream is complete.
    assert b'"usage"' not in plain
    assert plain.endswith(b"data: [DONE]\n\n")
    plain_events = events(plain)
    assert all(e["choices"] for e in plain_events)
    assert plain_events[-1]["choices"][0]["finish_reason"] == "length"
    # The one that asked gets the usage-only final chunk, as from the worker.
    asked_events = events(asked)
    assert asked_events[-1]["choices"] == []
    assert asked_events[-1]["usage"]["completion_tokens"] == 4
    # The policy heard both, with the worker's prompt and cached tokens.
    # (In order: s1, then s2; the policy knows them by the gateway's own ids.)
    [(s1, _, p1, _), (s2, _, p2, c2)] = policy.usage
    assert p1 > 0 and p2 == p1
    assert c2 > 0  # the same prompt again: cached where it went
    # And the reply's length, streamed or not asked for (a later turn re-sends the reply).
    assert policy.completions == {s1: 4, s2: 4} and s1 != s2
    assert 'kvgate_cached_tokens_total{model="demo"' in metrics


async def test_non_streaming_usage_reaches_the_policy(workers: list[WorkerHandle]) -> None:
    policy = SpyPolicy()
    async with (
        running_gateway(gateway_config(workers), policy=policy) as gw,
        aiohttp.ClientSession() as session,
    ):
        headers, raw = await chat(session, gw.openai_base, [FIRST], request_id="n1")
        await wait_until(lambda: bool(policy.usage), message="usage")
    usage = json.loads(raw)["usage"]
    rid = policy.routed[0][0]  # the gateway's own id; the client's "n1" is echoed
    assert rid != "n1" and headers["X-Request-ID"] == "n1"
    assert headers["X-Kvgate-Request-ID"] == rid  # the books' key, for the client to match
    assert policy.usage == [(rid, headers["X-Kvgate-Worker"], usage["prompt_tokens"], 0)]
    assert policy.completions == {rid: usage["completion_tokens"]} and usage["completion_tokens"]
    assert policy.routed == [(rid, headers["X-Kvgate-Worker"])]


async def test_stream_usage_can_be_turned_off(workers: list[WorkerHandle]) -> None:
    policy = SpyPolicy()
    async with (
        running_gateway(gateway_config(workers, stream_usage=False), policy=policy) as gw,
        aiohttp.ClientSession() as session,
    ):
        _, raw = await chat(session, gw.openai_base, [FIRST], request_id="o1", stream=True)
        await wait_until(lambda: bool(policy.routed), message="routing")
    assert b'"usage"' not in raw
    assert policy.usage == []  # nothing was asked, so nothing to feed back


def test_feature_and_index_block_sizes_must_agree() -> None:
    with pytest.raises(ConfigError, match="block_chars"):
        parse_config(
            {
                "features": {"block_chars": 128},
                "policy": {"name": "default", "options": {"index": {"block_chars": 256}}},
            }
        )
    # Unset, the index takes the features' block size.
    config = parse_config({"features": {"block_chars": 128}, "policy": {"name": "default"}})
    assert config.policy_options()["index"]["block_chars"] == 128
    assert FeatureConfig().block_chars == 256
