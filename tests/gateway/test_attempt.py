"""Each attempt ends once, through the one ``Attempt``, on every path, black box.

Through a gateway in front of emulated workers: answered, streamed, retried after
a 5xx, cut mid-stream, timed out, and the client leaving mid-stream. After each,
the worker's lease is back (nothing counted in flight), the policy heard exactly
one end for every placement it was told of, and every attempt's end went to the
end listeners exactly once. A worker that cuts every stream is ejected by
outlier detection (issue 45.6: success used to be recorded at the headers).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
import pytest

from kvgate.core.attempt import AttemptEnd, EndKind, Judgement
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.round_robin import RoundRobin, RoundRobinConfig
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import wait_until
from kvgate.types import WorkerId

from .conftest import every_worker_up, gateway_config, set_faults, worker_fleet

pytestmark = pytest.mark.usefixtures("both_servers")


class CountingPolicy(RoundRobin):
    """Round robin that counts what it is told of each request: placed, and ended."""

    def __init__(self) -> None:
        super().__init__(RoundRobinConfig())
        self.routed: Counter[str] = Counter()
        self.ended: Counter[str] = Counter()

    def on_routed(self, request: RequestFeatures, worker: WorkerId, now: float) -> None:
        self.routed[request.request_id] += 1

    def on_usage(
        self,
        request: RequestFeatures,
        worker: WorkerId,
        prompt_tokens: int,
        cached_tokens: int,
        now: float,
        *,
        completion_tokens: int = 0,
    ) -> None:
        self.ended[request.request_id] += 1

    def on_dropped(self, request: RequestFeatures, worker: WorkerId, now: float) -> None:
        self.ended[request.request_id] += 1


class Ends:
    """The end listener: every attempt's end, as told."""

    def __init__(self, gw: GatewayHandle) -> None:
        self.seen: list[AttemptEnd] = []
        gw.gateway.router.add_end_listener(self.told)

    def told(self, features: RequestFeatures, end: AttemptEnd) -> None:
        self.seen.append(end)


def chat(tag: str, *, stream: bool, max_tokens: int = 8) -> dict[str, Any]:
    return {
        "model": "demo",
        "messages": [{"role": "user", "content": f"hello from {tag} " * 10}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def post(gw: GatewayHandle, body: dict[str, Any]) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.openai_base + "/chat/completions", json=body) as resp,
    ):
        return resp.status, await resp.read()


async def settled(gw: GatewayHandle, policy: CountingPolicy) -> None:
    """Wait for the gateway to finish every request; then nothing may stay counted and
    the policy must have heard one end per placement."""
    await wait_until(lambda: gw.gateway.proxy.in_flight == 0, message="requests finished")
    pool = gw.gateway.pool
    assert pool.in_flight() == 0 and sum(w.kv_in_flight_tokens for w in pool) == 0
    assert policy.ended == policy.routed


async def test_every_path_ends_each_attempt_once() -> None:
    policy = CountingPolicy()
    async with worker_fleet(2) as fleet:
        config = gateway_config(
            fleet,
            retries={"count": 2, "backoff_base_s": 0.0, "backoff_max_s": 0.0},
            outlier={"consecutive_failures": 1000},
            timeouts={"first_byte_s": 0.3},
        )
        async with running_gateway(config, policy=policy) as gw:
            await every_worker_up(gw)
            ends = Ends(gw)
            # Answered whole, and streamed to the end.
            for stream in (False, True):
                status, _ = await post(gw, chat(f"ok-{stream}", stream=stream))
                assert status == 200
            await settled(gw, policy)
            assert [(e.kind, e.judgement) for e in ends.seen] == [
                (EndKind.COMPLETED, Judgement.OK)
            ] * 2
            assert all(e.prompt_tokens and e.ttft_s is not None for e in ends.seen)
            # One request at a time: nothing of the gateway's was queued ahead at the send.
            assert all((e.ahead_requests, e.ahead_kv_tokens) == (0, 0) for e in ends.seen)

            # A 5xx on one worker, served by the other: two attempts, each ended once.
            await set_faults(fleet[0], error_rate=1.0)
            ends.seen.clear()
            for i in range(2):
                status, _ = await post(gw, chat(f"retry-{i}", stream=False))
                assert status == 200
            await settled(gw, policy)
            failed = [e for e in ends.seen if e.kind is EndKind.FAILED]
            assert failed and {(e.judgement, e.status) for e in failed} == {
                (Judgement.UNSETTLED, 500)
            }
            assert len(ends.seen) == 2 + len(failed)

            # Cut mid-stream: a failure whatever its 200 said.
            await set_faults(fleet[0], error_rate=0.0, close_mid_stream_after=1)
            await set_faults(fleet[1], close_mid_stream_after=1)
            ends.seen.clear()
            status, body = await post(gw, chat("cut", stream=True, max_tokens=32))
            assert status == 200 and b"stream_broken" in body
            await settled(gw, policy)
            assert [(e.kind, e.judgement, e.failure) for e in ends.seen] == [
                (EndKind.FAILED, Judgement.FAULT, "broken")
            ]

            # Timed out before the first byte (both workers hang): 504.
            await set_faults(fleet[0], close_mid_stream_after=None, hang=True)
            await set_faults(fleet[1], close_mid_stream_after=None, hang=True)
            ends.seen.clear()
            status, _ = await post(gw, chat("hang", stream=False))
            assert status == 504
            await settled(gw, policy)
            assert ends.seen and all(e.failure == "timeout" for e in ends.seen)
            assert all(e.judgement is Judgement.FAULT for e in ends.seen)


async def test_a_client_leaving_mid_stream_cancels_the_attempt_once() -> None:
    """Cancelled, judged nothing, the lease back. The worker decodes at a real GPU's pace
    (a stream of seconds), so the client surely leaves before the answer's end."""
    policy = CountingPolicy()
    async with (
        worker_fleet(1, profile="h100-llama3-8b", time_scale=1.0) as fleet,
        running_gateway(gateway_config(fleet), policy=policy) as gw,
    ):
        await every_worker_up(gw)
        ends = Ends(gw)
        await client_leaves_mid_stream(gw)
        await settled(gw, policy)
        assert [(e.kind, e.judgement) for e in ends.seen] == [(EndKind.CANCELLED, Judgement.NONE)]
        assert ends.seen[0].chunks >= 1 and ends.seen[0].prompt_tokens is None


async def client_leaves_mid_stream(gw: GatewayHandle) -> None:
    """Read the head and a long stream's first token, then go away (the role chunk the
    worker opens with is not a token: ``usage.opening_only``)."""
    body = chat("leaver", stream=True, max_tokens=2000)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(gw.openai_base + "/chat/completions", json=body)
        assert resp.status == 200
        line = b""
        while b'"content":"' not in line or b'"content":""' in line:
            line = await asyncio.wait_for(resp.content.readline(), 30)
            assert line, "the stream ended before its first token"
        resp.close()
    await asyncio.sleep(0)


async def test_a_worker_that_cuts_every_stream_is_ejected() -> None:
    """Issue 45.6: 200 then a cut stream, every time. Success used to be recorded at the
    headers, so the failure streak never grew and the worker was never ejected."""
    async with worker_fleet(2) as fleet:
        await set_faults(fleet[0], close_mid_stream_after=1)
        config = gateway_config(
            fleet,
            policy={"name": "round_robin"},
            outlier={"consecutive_failures": 3, "probe_readmit_after_s": 60.0},
        )
        async with running_gateway(config) as gw:
            await every_worker_up(gw)
            cutter = gw.gateway.pool.get(fleet[0].url)
            assert cutter is not None
            broken = 0
            for i in range(12):
                status, body = await post(gw, chat(f"s{i}", stream=True, max_tokens=32))
                assert status == 200
                broken += b"stream_broken" in body
                if cutter.ejected:
                    break
            assert cutter.ejected, f"{broken} broken streams, still in service"
            assert broken == 3  # ejected at its third consecutive failure
            # Every later request goes to the healthy worker, whole.
            for i in range(4):
                status, body = await post(gw, chat(f"after{i}", stream=True, max_tokens=32))
                assert status == 200 and b"stream_broken" not in body
