"""Chat and text completions through the official OpenAI client, streamed and not."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openai import AsyncOpenAI

from kvgate.engine.tokenizer import tokenize
from kvgate.workersim import WorkerOptions, running_worker
from kvgate.workersim.protocol import ChatMessage, render_chat
from kvgate.workersim.responses import filler

from .conftest import FAST

SYSTEM = "You are a terse assistant that answers questions about paged attention. " * 6


def _messages(*turns: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}] + [
        {"role": role, "content": content} for role, content in turns
    ]


def _prompt_tokens(messages: list[dict[str, str]]) -> int:
    return len(tokenize(render_chat([ChatMessage.model_validate(m) for m in messages])))


async def test_chat_completion_has_openai_shape_and_usage(client: AsyncOpenAI) -> None:
    messages = _messages(("user", "What is a KV block?"))
    reply = await client.chat.completions.create(model=FAST.model, messages=messages, max_tokens=12)
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == FAST.model
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert choice.message.content == filler(0, 12)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 12
    assert reply.usage.prompt_tokens == _prompt_tokens(messages)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    assert reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


async def test_repeated_prompt_hits_the_prefix_cache(client: AsyncOpenAI) -> None:
    messages = _messages(("user", "Explain prefix caching in one line."))
    first = await client.chat.completions.create(model=FAST.model, messages=messages, max_tokens=4)
    second = await client.chat.completions.create(model=FAST.model, messages=messages, max_tokens=4)
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    prompt = second.usage.prompt_tokens
    assert cached % FAST.block_size == 0
    # Every full block of the prompt is shared (the engine may recompute the last).
    assert prompt - FAST.block_size <= cached <= prompt


async def test_next_turn_hits_the_previous_answer(client: AsyncOpenAI) -> None:
    turn1 = _messages(("user", "Tell me about eviction."))
    first = await client.chat.completions.create(model=FAST.model, messages=turn1, max_tokens=64)
    answer = first.choices[0].message.content
    assert answer is not None and first.usage is not None
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "More?"}]
    second = await client.chat.completions.create(model=FAST.model, messages=turn2, max_tokens=4)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    held = first.usage.prompt_tokens + first.usage.completion_tokens
    # The answer's blocks were cached when it finished, so the hit reaches past
    # the first prompt into the answer.
    assert cached > first.usage.prompt_tokens
    assert cached >= (held // FAST.block_size - 1) * FAST.block_size


async def test_streamed_chat_matches_the_unstreamed_answer(client: AsyncOpenAI) -> None:
    messages = _messages(("user", "Stream, please."))
    stream = await client.chat.completions.create(
        model=FAST.model,
        messages=messages,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == filler(0, 20)
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishing[-1] == "length"
    assert all(reason is None for reason in finishing[:-1])
    # With include_usage the last chunk has no choices and carries usage.
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 20
    assert last.usage.prompt_tokens == _prompt_tokens(messages)
    assert all(c.usage is None for c in chunks[:-1])


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_continuous_usage_stats_put_the_counts_so_far_on_every_chunk(
    client: AsyncOpenAI, endpoint: str
) -> None:
    """vLLM's ``stream_options.continuous_usage_stats``: every chunk carries usage, its
    completion tokens growing to the total; the usage-only chunk still ends the stream."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    if endpoint == "chat":
        messages = _messages(("user", "count the pages of the cache"))
        stream: Any = await client.chat.completions.create(
            model=FAST.model, messages=messages, max_tokens=12, stream=True, stream_options=options
        )
    else:
        stream = await client.completions.create(
            model=FAST.model, prompt="count the pages", max_tokens=12, stream=True,
            stream_options=options,
        )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 12
    assert counts[0] < counts[-1]  # counted as the stream went, not once at the end
    prompt = {c.usage.prompt_tokens for c in chunks}
    assert len(prompt) == 1 and prompt.pop() > 0
    assert chunks[-1].choices == []
    assert all(
        c.usage.total_tokens == c.usage.prompt_tokens + n
        for c, n in zip(chunks, counts, strict=True)
    )


async def test_text_completion_streamed_and_not(client: AsyncOpenAI) -> None:
    prompt = "Once upon a time there was a paged KV cache that " * 4
    whole = await client.completions.create(model=FAST.model, prompt=prompt, max_tokens=9)
    assert whole.object == "text_completion"
    assert whole.id.startswith("cmpl-")
    assert whole.choices[0].text == filler(0, 9)
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == len(tokenize(prompt))
    stream = await client.completions.create(
        model=FAST.model, prompt=prompt, max_tokens=9, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks) == filler(0, 9)
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_token_id_prompt_is_taken_as_tokens(client: AsyncOpenAI) -> None:
    ids = list(range(100, 170))
    reply = await client.completions.create(model=FAST.model, prompt=ids, max_tokens=3)
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(ids)


async def test_unset_max_tokens_draws_a_seeded_length() -> None:
    options = WorkerOptions(port=0, profile="fast", seed=FAST.seed, output_tokens_mean=20)
    lengths: list[list[int]] = []
    for _ in range(2):
        async with (
            running_worker(options) as twin,
            AsyncOpenAI(base_url=twin.url + "/v1", api_key="x", max_retries=0) as oai,
        ):
            run: list[int] = []
            for i in range(5):
                reply = await oai.completions.create(model=options.model, prompt=f"hello {i}")
                assert reply.choices[0].finish_reason == "stop"
                assert reply.usage is not None
                run.append(reply.usage.completion_tokens)
            lengths.append(run)
    assert lengths[0] == lengths[1]
    assert all(1 <= n <= options.output_tokens_max for n in lengths[0])
    assert len(set(lengths[0])) > 1


async def test_concurrent_requests_under_memory_pressure_all_complete() -> None:
    # 24 blocks of 16 tokens hold 384 tokens; six requests of ~40 + 120 tokens
    # cannot all run at once, so the engine preempts. Slowed down ten times so all
    # six arrive long before the first could finish.
    options = WorkerOptions(port=0, profile="fast", kv_blocks=24, seed=1, time_scale=0.1)
    async with (
        running_worker(options) as worker,
        AsyncOpenAI(base_url=worker.url + "/v1", api_key="x", max_retries=0) as client,
    ):

        async def one(i: int) -> tuple[int, str]:
            stream = await client.completions.create(
                model=options.model,
                prompt=f"request {i}: " + "tell me about pages " * 8,
                max_tokens=120,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, completion = "", -1
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].text
                elif chunk.usage is not None:
                    completion = chunk.usage.completion_tokens
            return completion, text

        results = await asyncio.gather(*(one(i) for i in range(6)))
        stats = worker.engine.stats(worker.worker.driver.now())
    assert all(result == (120, filler(0, 120)) for result in results)
    assert stats.preemptions > 0
    assert stats.requests_finished == 6
