"""Health, model listing and the KV offload endpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openai import AsyncOpenAI

from kvgate.engine.blocks import chain_hashes
from kvgate.engine.tokenizer import tokenize
from kvgate.workersim import WorkerHandle, running_worker
from kvgate.workersim.protocol import ChatMessage, render_chat

from .conftest import FAST
from .helpers import get_json, post

OFFLOAD = FAST.model_copy(update={"cpu_offload_blocks": 256, "version": "v2.1"})
MESSAGES = [{"role": "user", "content": "Please remember this long context. " * 12}]


@pytest.fixture
async def offload_worker() -> AsyncIterator[WorkerHandle]:
    """A fast worker with a CPU offload tier."""
    async with running_worker(OFFLOAD) as handle:
        yield handle


async def test_health_and_models(offload_worker: WorkerHandle) -> None:
    status, body = await get_json(offload_worker.url + "/health")
    assert status == 200 and body == {"status": "ok"}
    async with AsyncOpenAI(base_url=offload_worker.url + "/v1", api_key="x") as client:
        models = [m async for m in client.models.list()]
    assert [m.id for m in models] == [OFFLOAD.model]
    card = models[0].model_dump()
    assert card["owned_by"] == "kvgate"
    assert card["kvgate_version"] == OFFLOAD.version
    assert card["max_model_len"] == offload_worker.worker.context_limit


async def test_offload_by_session_moves_its_blocks(offload_worker: WorkerHandle) -> None:
    async with AsyncOpenAI(base_url=offload_worker.url + "/v1", api_key="x") as client:
        await client.chat.completions.create(
            model=OFFLOAD.model,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=8,
            extra_headers={"X-Session-ID": "alice"},
        )
        engine = offload_worker.engine
        assert engine.residency("alice").gpu > 0
        status, body = await post(offload_worker.url + "/kv/offload", {"session_ids": ["alice"]})
        assert status == 200
        assert body["sessions"] == 1
        assert body["offloaded"] > 0 and body["in_use"] == 0
        residency = engine.residency("alice")
        assert residency.gpu == 0
        assert residency.cpu == body["offloaded"]
        # The next turn brings the blocks back instead of recomputing them.
        await client.chat.completions.create(
            model=OFFLOAD.model,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=8,
            extra_headers={"X-Session-ID": "alice"},
        )
        assert engine.stats(offload_worker.worker.driver.now()).restored_blocks > 0


async def test_offload_with_copy_keeps_the_gpu_blocks_beside_the_tier(
    offload_worker: WorkerHandle,
) -> None:
    async with AsyncOpenAI(base_url=offload_worker.url + "/v1", api_key="x") as client:
        ask = {"model": OFFLOAD.model, "messages": MESSAGES, "max_tokens": 8}
        await client.chat.completions.create(**ask, extra_headers={"X-Session-ID": "bob"})  # type: ignore[call-overload]
        engine = offload_worker.engine
        on_gpu = engine.residency("bob").gpu
        status, body = await post(
            offload_worker.url + "/kv/offload", {"session_ids": ["bob"], "copy": True}
        )
        assert status == 200
        assert body["copied"] == on_gpu > 0 and body["offloaded"] == 0
        assert engine.residency("bob").gpu == on_gpu  # still served from the GPU
        await client.chat.completions.create(**ask, extra_headers={"X-Session-ID": "bob"})  # type: ignore[call-overload]
        assert engine.stats(offload_worker.worker.driver.now()).restored_blocks == 0


async def test_offload_by_prompt_names_its_prefix_blocks(offload_worker: WorkerHandle) -> None:
    text = "A completion prompt whose prefix blocks we offload by text. " * 6
    async with AsyncOpenAI(base_url=offload_worker.url + "/v1", api_key="x") as client:
        await client.chat.completions.create(
            model=OFFLOAD.model,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=2,
        )
        await client.completions.create(model=OFFLOAD.model, prompt=text, max_tokens=2)
    chat_blocks = chain_hashes(
        tokenize(render_chat([ChatMessage.model_validate(m) for m in MESSAGES])), OFFLOAD.block_size
    )
    text_blocks = chain_hashes(tokenize(text), OFFLOAD.block_size)
    status, body = await post(
        offload_worker.url + "/kv/offload", {"prompts": [MESSAGES, text, "never seen"]}
    )
    assert status == 200
    assert body["requested_blocks"] == len(chat_blocks) + len(text_blocks)
    assert body["offloaded"] == len(chat_blocks) + len(text_blocks)
    status, body = await post(offload_worker.url + "/kv/offload", {"block_hashes": text_blocks})
    assert status == 200
    assert body["not_resident"] == len(text_blocks)


async def test_offload_rejects_unknown_fields(offload_worker: WorkerHandle) -> None:
    status, body = await post(offload_worker.url + "/kv/offload", {"sessions": ["x"]})
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"
