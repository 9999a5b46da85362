"""The emulated worker speaks Anthropic's Messages API, read with the official client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from kvgate.workersim import WorkerHandle

SYSTEM = "You are a careful coding agent. " * 40  # a few blocks of shared preamble
TOOLS: list[Any] = [
    {
        "name": "run",
        "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]


@pytest.fixture
async def claude(worker: WorkerHandle) -> AsyncIterator[AsyncAnthropic]:
    async with AsyncAnthropic(base_url=worker.url, api_key="unused", max_retries=0) as client:
        yield client


async def test_a_message_and_its_next_turn_read_the_first_from_the_cache(
    claude: AsyncAnthropic,
) -> None:
    first = await claude.messages.create(
        model="demo",
        max_tokens=5,
        system=SYSTEM,
        messages=[{"role": "user", "content": "hello"}],
    )
    assert first.type == "message" and first.role == "assistant"
    assert first.stop_reason == "max_tokens"
    assert first.content[0].type == "text" and len(first.content[0].text.split()) == 5
    assert first.usage.output_tokens == 5
    assert first.usage.cache_read_input_tokens == 0
    second = await claude.messages.create(
        model="demo",
        max_tokens=3,
        system=SYSTEM,
        messages=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": first.content[0].text},
            {"role": "user", "content": "and then?"},
        ],
    )
    read = second.usage.cache_read_input_tokens or 0
    assert read >= first.usage.input_tokens // 2  # the system prompt and first turn, cached
    assert second.usage.input_tokens > 0


async def test_a_streamed_message_sends_anthropics_events_with_usage(
    claude: AsyncAnthropic,
) -> None:
    kinds: list[str] = []
    async with claude.messages.stream(
        model="demo", max_tokens=6, messages=[{"role": "user", "content": "stream it"}]
    ) as stream:
        async for event in stream:
            kinds.append(event.type)
        final = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    assert final.usage.output_tokens == 6
    assert final.content[0].type == "text" and len(final.content[0].text.split()) == 6


@pytest.mark.parametrize("stream", [False, True])
async def test_a_forced_tool_choice_ends_the_turn_calling_the_tool(
    claude: AsyncAnthropic, stream: bool
) -> None:
    ask: dict[str, Any] = {
        "model": "demo",
        "max_tokens": 4,
        "tools": TOOLS,
        "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "list the files"}],
    }
    if stream:
        async with claude.messages.stream(**ask) as events:
            message = await events.get_final_message()
    else:
        message = await claude.messages.create(**ask)
    assert message.stop_reason == "tool_use"
    block = message.content[0]
    assert block.type == "tool_use" and block.name == "run"
    assert isinstance(block.input, dict) and block.input


async def test_chat_then_messages_hits_the_same_cache(
    worker: WorkerHandle, claude: AsyncAnthropic
) -> None:
    async with AsyncOpenAI(base_url=worker.url + "/v1", api_key="unused", max_retries=0) as oai:
        chat = await oai.chat.completions.create(
            model="demo",
            max_tokens=4,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
        )
    answer = chat.choices[0].message.content or ""
    then = await claude.messages.create(
        model="demo",
        max_tokens=2,
        system=SYSTEM,
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "more"},
        ],
    )
    assert chat.usage is not None
    # Everything the chat turn computed (its prompt and answer) is read from the cache.
    assert (then.usage.cache_read_input_tokens or 0) >= chat.usage.prompt_tokens - 16


async def test_errors_are_in_anthropics_shape(claude: AsyncAnthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        await claude.messages.create(
            model="nope", max_tokens=2, messages=[{"role": "user", "content": "x"}]
        )
    assert isinstance(missing.value.body, dict)
    assert missing.value.body["type"] == "error"
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        await claude.messages.create(
            model="demo",
            max_tokens=2,
            messages=[{"role": "system", "content": "x"}],  # type: ignore[list-item]
        )
    assert isinstance(bad.value.body, dict)
    assert bad.value.body["error"]["type"] == "invalid_request_error"
