"""Sessions away on a tool call: seen in answers of both APIs, their KV reserved, offloaded."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from anthropic import AsyncAnthropic
from prometheus_client.parser import text_string_to_metric_families

from kvgate.core.attempt import AttemptEnd, EndKind
from kvgate.core.routed import Scraped
from kvgate.core.session import scoped
from kvgate.gateway.control.toolcalls import ToolCallPlane
from kvgate.gateway.dataplane.queue import AdmissionQueue
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Worker, WorkerPool
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import wait_until
from kvgate.workersim.runner import WorkerHandle

from .conftest import every_worker_up, gateway_config

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]


def _reserved(gw: GatewayHandle) -> dict[str, int]:
    return {w.id: w.routed.kv_reserved_tokens for w in gw.gateway.pool}


async def _chat(gw: GatewayHandle, session: str, choice: str, *, stream: bool) -> dict[str, Any]:
    body = {
        "model": "demo",
        "max_tokens": 4,
        "stream": stream,
        "tools": TOOLS,
        "tool_choice": choice,
        "messages": [
            {"role": "system", "content": "agent " * 200},
            {"role": "user", "content": "go"},
        ],
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            gw.openai_base + "/chat/completions", json=body, headers={"session_id": session}
        ) as reply,
    ):
        assert reply.status == 200
        text = await reply.text()
    return {"text": text, "worker": reply.headers["X-Kvgate-Worker"]}


@pytest.mark.usefixtures("both_servers")
@pytest.mark.parametrize("stream", [False, True])
async def test_a_turn_ending_in_a_tool_call_reserves_its_kv_until_the_session_returns(
    workers: list[WorkerHandle], stream: bool
) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        await every_worker_up(gw)
        plane = gw.gateway.tool_calls
        assert plane is not None
        first = await _chat(gw, "agent-1", "required", stream=stream)
        assert "tool_calls" in first["text"]
        await wait_until(lambda: plane.tool_calls == 1, message="the tool call seen")
        reserved = _reserved(gw)
        assert reserved[first["worker"]] > 0  # the session's prompt and answer, spoken for
        assert sum(reserved.values()) == reserved[first["worker"]]
        # The tool's result comes back: the reservation ends, and the pause is learned.
        back = await _chat(gw, "agent-1", "none", stream=stream)
        assert back["worker"] == first["worker"]
        await wait_until(lambda: plane.book.pauses.samples == 1, message="the pause learned")
        assert sum(_reserved(gw).values()) == 0
        # An answer that does not call a tool books nothing.
        assert plane.tool_calls == 1 and len(plane.book) == 0


async def test_a_messages_turn_ending_in_tool_use_is_booked(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        await every_worker_up(gw)
        plane = gw.gateway.tool_calls
        assert plane is not None
        async with AsyncAnthropic(base_url=gw.url, api_key="k", max_retries=0) as claude:
            for stream in (False, True):
                ask: dict[str, Any] = {
                    "model": "demo",
                    "max_tokens": 3,
                    "tools": [{"name": "run", "input_schema": {"type": "object"}}],
                    "tool_choice": {"type": "any"},
                    "messages": [{"role": "user", "content": "ls"}],
                    "extra_headers": {"x-claude-code-session-id": f"cc-{stream}"},
                }
                if stream:
                    async with claude.messages.stream(**ask) as events:
                        await events.get_final_message()
                else:
                    await claude.messages.create(**ask)
        await wait_until(lambda: len(plane.book) == 2, message="both turns booked")
        # Booked under the session key scoped by the client's x-api-key (core.session.scoped).
        booked = [plane.book.get(scoped(f"cc-{stream}", b"k")) for stream in (False, True)]
        assert None not in booked


async def test_away_sessions_are_offloaded_once_to_a_lossless_tier_past_the_threshold(
    workers: list[WorkerHandle],
) -> None:
    asked: list[tuple[str, list[str], str]] = []

    async def offload(worker: Worker, keys: list[str], reason: str) -> bool:
        asked.append((worker.id, keys, reason))
        return True

    async with running_gateway(gateway_config(workers)) as gw:
        await every_worker_up(gw)
        pool = gw.gateway.pool
        keeps = ToolCallPlane(pool, offload=offload, offload_at=0.85, lossless=lambda w: True)
        drops = ToolCallPlane(pool, offload=offload, offload_at=0.85)
        calm, full = list(pool)
        calm.update(signals=Scraped(kv_usage=0.2, kv_capacity_tokens=10_000), signals_at=0.0)
        full.update(signals=Scraped(kv_usage=0.9, kv_capacity_tokens=10_000), signals_at=0.0)
        drops.left("d", full, 100)  # a worker that would drop offloaded KV keeps it
        await drops.stop()
        assert asked == []
        keeps.left("a", calm, 1000)
        keeps.left("b", full, 2000)
        keeps.left("c", full, 500)
        await keeps.stop()
        assert asked == [(full.id, ["b"], "tool_call"), (full.id, ["c"], "tool_call")]
        # Offloaded KV is off the GPU: no longer reserved there; the calm worker's still is.
        assert calm.routed.kv_reserved_tokens == 1000 and full.routed.kv_reserved_tokens == 0


async def _scrape(gw: GatewayHandle) -> dict[str, float]:
    """The unlabelled samples of the gateway's ``/metrics`` page, by name."""
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/metrics") as reply:
        assert reply.status == 200
        text = await reply.text()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


async def test_tool_calls_away_sessions_and_the_learned_horizon_are_on_metrics(
    workers: list[WorkerHandle],
) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        await every_worker_up(gw)
        plane = gw.gateway.tool_calls
        assert plane is not None
        before = await _scrape(gw)
        assert before["kvgate_tool_call_sessions_away"] == 0
        assert before["kvgate_tool_call_horizon_seconds"] == plane.book.pauses.prior_s
        await _chat(gw, "agent-a", "required", stream=False)
        await _chat(gw, "agent-b", "required", stream=False)
        await wait_until(lambda: plane.tool_calls == 2, message="both tool calls seen")
        away = await _scrape(gw)
        assert away["kvgate_tool_call_sessions_away"] == 2
        assert away["kvgate_tool_calls_total"] == 2
        assert away["kvgate_tool_call_bookings_total"] == 2
        assert away["kvgate_tool_call_returns_total"] == 0
        await _chat(gw, "agent-a", "none", stream=False)  # the tool's result comes back
        await wait_until(lambda: plane.book.pauses.samples == 1, message="the pause learned")
        back = await _scrape(gw)
    assert back["kvgate_tool_call_sessions_away"] == 1
    assert back["kvgate_tool_call_returns_total"] == 1
    assert back["kvgate_tool_calls_total"] == 2  # a turn that calls no tool books nothing
    # One pause is fewer than ToolPauses.min_samples: the horizon is still the prior.
    assert back["kvgate_tool_call_horizon_seconds"] == plane.book.pauses.horizon()


def test_the_horizon_gauge_follows_the_pauses_learned() -> None:
    now = [0.0]
    plane = ToolCallPlane(WorkerPool([], 5.0, AdmissionQueue(1)), offload=None, mono=lambda: now[0])
    metrics = GatewayMetrics()
    metrics.watch_tool_calls(plane.reading)
    worker_id = "http://w"
    for n in range(plane.book.pauses.min_samples):  # pauses of 1..8 s
        plane.book.left(f"s{n}", worker_id, 10, now[0])
        now[0] += n + 1.0
        plane.returned(f"s{n}")
    horizon = metrics.registry.get_sample_value("kvgate_tool_call_horizon_seconds")
    assert horizon == plane.book.pauses.horizon() == 8.0  # the 0.9 quantile of 1..8
    assert metrics.registry.get_sample_value("kvgate_tool_call_returns_total") == 8


_CALL = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"tool_calls":[{"index":0,"id":"t1","type":"function","function":{"name":"run",'
    b'"arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":null}\n\n'
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":'
    b'{"prompt_tokens":900,"completion_tokens":12,"total_tokens":912}}\n\n'
)


@contextlib.asynccontextmanager
async def _calling_worker() -> AsyncIterator[str]:
    """A worker whose every answer streams a tool call and its usage (``"usage": null`` on
    the other events, as vLLM and SGLang send once it is asked for), then ends with
    ``[DONE]``, or, for a request whose session id starts with ``cut``, breaks off."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_CALL)
        if request.headers.get("session_id", "").startswith("cut"):
            assert request.transport is not None
            request.transport.close()  # no end of the chunked body: a broken stream
            return response
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "demo", "object": "model"}]})

    app = web.Application()

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.usefixtures("both_servers")
async def test_a_session_is_booked_away_by_its_attempts_end_and_only_if_it_got_the_call() -> None:
    ends: list[AttemptEnd] = []
    async with _calling_worker() as url:
        config = {"workers": [{"url": url}], "health": {"interval_s": 0.1, "timeout_s": 2.0},
                  "retries": {"count": 0}}  # fmt: skip
        async with running_gateway(config) as gw, aiohttp.ClientSession() as http:
            await wait_until(gw.gateway.ready, message="the worker is up")
            gw.gateway.router.add_end_listener(lambda f, end: ends.append(end))
            plane = gw.gateway.tool_calls
            assert plane is not None
            for session in ("whole", "cut"):
                body = {"model": "demo", "stream": True, "tools": TOOLS,
                        "messages": [{"role": "user", "content": "go"}]}  # fmt: skip
                async with http.post(
                    gw.openai_base + "/chat/completions", json=body, headers={"session_id": session}
                ) as reply:
                    text = await reply.text()
                assert '"tool_calls"' in text
            await wait_until(lambda: len(ends) == 2, message="both attempts ended")
    whole, cut = ends
    # Streamed to its end: its end says it called a tool, and the session is away.
    assert (whole.kind, whole.tool_call) == (EndKind.COMPLETED, True)
    away = plane.book.get("whole")
    assert away is not None and away.kv_tokens == 912
    # Broken off after the call: the worker failed the attempt, the client sees an error
    # and sends the turn again; nothing is booked.
    assert "stream_broken" in text
    assert (cut.kind, cut.tool_call) == (EndKind.FAILED, False)
    assert plane.book.get("cut") is None and plane.tool_calls == 1
