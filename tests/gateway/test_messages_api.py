"""Anthropic's Messages API through the gateway, read with the official ``anthropic`` client."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from kvgate.gateway.dataplane.relay import REASON_HEADER, WORKER_HEADER
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import wait_until
from kvgate.workersim.runner import WorkerHandle

from .conftest import every_worker_up, gateway_config, set_faults

pytestmark = pytest.mark.usefixtures("both_servers")

SYSTEM = "You are a careful coding agent with a long shared tool preamble. " * 30


@pytest.fixture
async def gw(workers: list[WorkerHandle]) -> AsyncIterator[GatewayHandle]:
    async with running_gateway(gateway_config(workers, api_keys=["k"])) as handle:
        await every_worker_up(handle)
        yield handle


def _claude(gw: GatewayHandle, key: str = "k") -> AsyncAnthropic:
    return AsyncAnthropic(base_url=gw.url, api_key=key, max_retries=0)


def _metric(text: str, name: str) -> float:
    """The sum of a metric's samples (all label sets) in a Prometheus page."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(text))


async def test_messages_stream_and_not_with_usage_reasons_and_metrics(gw: GatewayHandle) -> None:
    async with _claude(gw) as claude:
        raw = await claude.messages.with_raw_response.create(
            model="demo",
            max_tokens=4,
            system=SYSTEM,
            messages=[{"role": "user", "content": "hello"}],
            extra_headers={"X-Session-ID": "conv-1"},
        )
        first = await raw.parse()
        async with claude.messages.stream(
            model="demo",
            max_tokens=3,
            system=SYSTEM,
            messages=[
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": first.content[0].text},  # type: ignore[union-attr]
                {"role": "user", "content": "go on"},
            ],
            extra_headers={"X-Session-ID": "conv-1"},
        ) as stream:
            kinds = [event.type async for event in stream]
            second = await stream.get_final_message()
            reason = stream.response.headers[REASON_HEADER]
            worker = stream.response.headers[WORKER_HEADER]
    assert raw.headers[REASON_HEADER] in ("least_loaded", "least_ttft", "prefix_match")
    assert (reason, worker) == ("affinity_hit", raw.headers[WORKER_HEADER])
    assert first.usage.output_tokens == 4 and second.usage.output_tokens == 3
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert (second.usage.cache_read_input_tokens or 0) > 0
    text = gw.gateway.metrics.render().decode()
    # Both answers' usage reached the metrics, cached tokens from cache_read_input_tokens.
    assert _metric(text, "kvgate_completion_tokens_total") == 7
    assert _metric(text, "kvgate_cached_tokens_total") == second.usage.cache_read_input_tokens
    prompt = first.usage.input_tokens + second.usage.input_tokens
    prompt += second.usage.cache_read_input_tokens or 0
    assert _metric(text, "kvgate_prompt_tokens_total") == prompt
    assert _metric(text, "kvgate_time_to_first_token_seconds_count") == 2
    assert 'reason="affinity_hit"' in text


async def test_a_conversation_that_switches_api_keeps_its_worker_and_cache(
    gw: GatewayHandle,
) -> None:
    # No session id: the conversation is followed by its chain, the same under either API.
    async with AsyncOpenAI(base_url=gw.openai_base, api_key="k", max_retries=0) as oai:
        chat = await oai.chat.completions.with_raw_response.create(
            model="demo",
            max_tokens=4,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
        )
    answer = chat.parse()
    async with _claude(gw) as claude:
        then = await claude.messages.with_raw_response.create(
            model="demo",
            max_tokens=2,
            system=SYSTEM,
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": answer.choices[0].message.content or ""},
                {"role": "user", "content": "more"},
            ],
        )
    assert then.headers[WORKER_HEADER] == chat.headers[WORKER_HEADER]
    assert then.headers[REASON_HEADER] == "prefix_match"
    usage = (await then.parse()).usage
    assert answer.usage is not None
    assert (usage.cache_read_input_tokens or 0) >= answer.usage.prompt_tokens - 16


async def test_gateway_errors_on_the_messages_path_are_anthropic_shaped(
    gw: GatewayHandle,
) -> None:
    async with _claude(gw) as claude:
        with pytest.raises(anthropic.NotFoundError) as missing:
            await claude.messages.create(
                model="nope", max_tokens=2, messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(anthropic.BadRequestError) as bad:
            await claude.messages.create(model="demo", max_tokens=2, messages=[])
    async with _claude(gw, key="wrong") as stranger:
        with pytest.raises(anthropic.AuthenticationError) as denied:
            await stranger.messages.create(
                model="demo", max_tokens=2, messages=[{"role": "user", "content": "x"}]
            )
    bodies: list[Any] = [missing.value.body, bad.value.body, denied.value.body]
    kinds = [b["error"]["type"] for b in bodies if isinstance(b, dict) and b["type"] == "error"]
    assert kinds == ["not_found_error", "invalid_request_error", "authentication_error"]
    assert "messages" in bad.value.message
    # The OpenAI paths keep OpenAI's shape.
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gw.openai_base + "/chat/completions",
            json={"model": "demo", "messages": []},
            headers={"Authorization": "Bearer k"},
        ) as reply,
    ):
        assert reply.status == 400
        assert set((await reply.json())["error"]) >= {"message", "type", "code"}


async def test_the_tool_use_stop_reaches_the_client_through_the_gateway(
    gw: GatewayHandle,
) -> None:
    tools: list[Any] = [{"name": "run", "input_schema": {"type": "object"}}]
    async with _claude(gw) as claude:
        message = await claude.messages.create(
            model="demo",
            max_tokens=3,
            tools=tools,
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "ls"}],
        )
        async with claude.messages.stream(
            model="demo",
            max_tokens=3,
            tools=tools,
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "ls"}],
        ) as stream:
            streamed = await stream.get_final_message()
    assert message.stop_reason == streamed.stop_reason == "tool_use"
    await wait_until(lambda: gw.gateway.proxy.in_flight == 0, message="requests done")


async def test_a_messages_stream_cut_by_the_worker_ends_in_an_anthropic_error_event(
    workers: list[WorkerHandle],
) -> None:
    config = gateway_config(workers, outlier={"consecutive_failures": 1000})
    async with running_gateway(config) as gw:
        await every_worker_up(gw)
        for worker in workers:
            await set_faults(worker, close_mid_stream_after=3)
        async with _claude(gw) as claude:
            with pytest.raises(anthropic.APIStatusError) as cut:
                async with claude.messages.stream(
                    model="demo", max_tokens=32, messages=[{"role": "user", "content": "go"}]
                ) as stream:
                    async for _ in stream:
                        pass
    assert isinstance(cut.value.body, dict)
    assert cut.value.body["type"] == "error"
    assert cut.value.body["error"]["type"] == "api_error"
    assert "broke off" in cut.value.body["error"]["message"]
