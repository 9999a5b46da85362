"""The worker's non-inference endpoints: health, models, metrics, KV offload, faults."""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from kvgate import __version__
from kvgate.engine.blocks import chain_hashes
from kvgate.engine.tokenizer import tokenize
from kvgate.workersim.faults import FaultUpdate
from kvgate.workersim.protocol import ApiError, ChatMessage, read_body, render_chat
from kvgate.workersim.worker import WORKER_KEY


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 while the engine's stepping task is alive, as vLLM does."""
    worker = request.app[WORKER_KEY]
    if worker.driver.failed:
        return web.json_response({"status": "engine failed"}, status=503)
    return web.json_response({"status": "ok"})


def _card(request: web.Request) -> dict[str, object]:
    worker = request.app[WORKER_KEY]
    options = worker.options
    card = {
        "id": options.model,
        "object": "model",
        "created": worker.created(),
        "owned_by": "kvgate",
        "root": options.model,
        "parent": None,
        "max_model_len": worker.context_limit,
        "kvgate_version": options.version,
        "kvgate_worker": {"profile": options.profile, "software": f"kvgate {__version__}"},
    }
    return card


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the one model served, with its version."""
    return web.json_response({"object": "list", "data": [_card(request)]})


async def model(request: web.Request) -> web.Response:
    """``GET /v1/models/{model}``: the model's card, or 404 for another name."""
    name = request.match_info["model"]
    if name != request.app[WORKER_KEY].options.model:
        raise ApiError(404, f"The model `{name}` does not exist.", code="model_not_found")
    return web.json_response(_card(request))


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text exposition of the worker's registry."""
    worker = request.app[WORKER_KEY]
    response = web.Response(body=generate_latest(worker.registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


class OffloadRequest(BaseModel):
    """The body of ``POST /kv/offload``; every field is optional, at least one is set."""

    model_config = ConfigDict(extra="forbid")

    session_ids: list[str] = Field(default_factory=list)
    prompts: list[str | list[ChatMessage]] = Field(default_factory=list)
    block_hashes: list[int] = Field(default_factory=list)
    copy_: bool = Field(default=False, alias="copy")
    """Copy the blocks to the tier and leave them on the GPU (``Engine.offload``'s ``copy``)."""


async def offload(request: web.Request) -> web.Response:
    """``POST /kv/offload``: move (``copy``: copy) sessions' or prompts' blocks to the
    offload tier.

    Text prompts are hashed as ``/v1/completions`` hashes them, message lists as
    ``/v1/chat/completions`` does, so the blocks named are those the prompt's
    requests hold.
    """
    worker = request.app[WORKER_KEY]
    body = await read_body(request, OffloadRequest)
    hashes: list[int] = list(body.block_hashes)
    block_size = worker.options.block_size
    for prompt in body.prompts:
        text = prompt if isinstance(prompt, str) else render_chat(prompt)
        hashes.extend(chain_hashes(tokenize(text), block_size))
    result = worker.engine.offload(
        session_ids=tuple(body.session_ids),
        block_hashes=tuple(hashes),
        now=worker.driver.now(),
        copy=body.copy_,
    )
    worker.driver.wake()
    return web.json_response(
        {"requested_blocks": len(hashes), "sessions": len(body.session_ids), **_fields(result)}
    )


async def get_faults(request: web.Request) -> web.Response:
    """``GET /admin/faults``: the faults in force."""
    return web.json_response(request.app[WORKER_KEY].faults.settings.model_dump())


async def set_faults(request: web.Request) -> web.Response:
    """``POST /admin/faults``: change some faults; answers the faults now in force."""
    worker = request.app[WORKER_KEY]
    update = await read_body(request, FaultUpdate)
    return web.json_response(worker.set_faults(update).model_dump())


def _fields(result: Any) -> dict[str, Any]:
    """A dataclass or pydantic result as a JSON-able dict."""
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return dataclasses.asdict(result)
    if isinstance(result, BaseModel):
        return result.model_dump()
    return {"result": result}
