"""``POST /v1/messages``: Anthropic's Messages API on the emulated engine.

The conversation is read as chat (``core.messages.as_chat``) and rendered through the
same template as ``/v1/chat/completions``, so a conversation that switches API hits the
KV its earlier turns left in this worker's prefix cache. Usage is Anthropic's:
``input_tokens`` past the cache, ``cache_read_input_tokens`` read from it,
``output_tokens``. Streaming sends Anthropic's events: ``message_start`` (with the
input's usage), ``content_block_start``, one ``content_block_delta`` per engine step,
``content_block_stop``, ``message_delta`` (stop reason, output usage), ``message_stop``.

A ``tool_choice`` that forces a tool (``{"type": "any"}``, ``{"type": "tool"}``) ends the
turn calling it: a ``tool_use`` block and ``stop_reason: tool_use``, as an agent's turns
end before it runs a tool. Errors are in Anthropic's shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvgate.core.messages import MessagesShapeError, as_chat, user_id
from kvgate.engine.records import EngineRequest
from kvgate.workersim.completions import ChunkSender, Run, settle
from kvgate.workersim.driver import EngineUnavailableError, Tokens
from kvgate.workersim.protocol import (
    ApiError,
    ChatMessage,
    Prompt,
    forced_tool,
    render_chat,
    validation_error,
)
from kvgate.workersim.responses import Usage, filler
from kvgate.workersim.slotapi import requested_slot
from kvgate.workersim.worker import WORKER_KEY, Worker

_STOPS = {"length": "max_tokens", "stop": "end_turn"}
"""The engine's finish reasons as the Messages API's stop reasons."""


class MessagesRequest(BaseModel):
    """The body of ``POST /v1/messages`` (the fields the emulation reads)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False


@dataclass(frozen=True, slots=True)
class _Turn:
    """How the turn ends: the engine's finish reason, the stop reason, the tool it calls."""

    finish: str
    stop: str
    tool: str | None
    call_id: str


def _usage(usage: Usage) -> dict[str, Any]:
    """Anthropic's ``usage``: the input past the cache, the input read from it, the output."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def _content(text: str, tool: str | None, call_id: str) -> dict[str, Any]:
    if tool is None:
        return {"type": "text", "text": text}
    return {"type": "tool_use", "id": call_id, "name": tool, "input": {"input": text}}


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    data = json.dumps({"type": kind, **payload}, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


async def messages_endpoint(request: web.Request) -> web.StreamResponse:
    """``POST /v1/messages``, errors in Anthropic's shape."""
    try:
        return await _messages(request)
    except ApiError as exc:
        return web.json_response(exc.anthropic_body(), status=exc.status)


async def _messages(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    try:
        body = MessagesRequest.model_validate(data)
        chat, tools = as_chat(data)
        turns = [ChatMessage.model_validate(m) for m in chat]
    except ValidationError as exc:
        raise validation_error(exc) from None
    except MessagesShapeError as exc:
        raise ApiError(400, exc.message, param=exc.param) from None
    worker = request.app[WORKER_KEY]
    worker.check_model(body.model)
    if worker.faults.draw_error():
        raise ApiError(500, "injected fault: internal error", type_="api_error", code="fault")
    prompt = Prompt.of_text(render_chat(turns, tools))
    max_tokens, finish = worker.output_budget(body.max_tokens, len(prompt.tokens))
    tool = forced_tool(tools, data.get("tool_choice"))
    stop = "tool_use" if tool is not None else _STOPS.get(finish, "end_turn")
    message_id = "msg_" + worker.new_request_id("m")[2:]
    turn = _Turn(finish, stop, tool, "toolu_" + message_id[4:])
    session = request.headers.get(worker.options.session_header) or user_id(data)
    engine_request = worker.engine_request(message_id, prompt, max_tokens, session)
    table = worker.slot_table
    if table is None:
        return await _run(request, worker, body, engine_request, turn)
    # A llama.cpp server: the request runs in one slot, against that slot's KV only.
    slot = await table.acquire(
        requested_slot(body.model_extra, table),
        list(engine_request.block_hashes),
        task=worker.requests_started,
    )
    try:
        pinned = table.begin(slot, engine_request)
        return await _run(request, worker, body, pinned, turn)
    finally:
        table.release(slot)


async def _run(
    request: web.Request,
    worker: Worker,
    body: MessagesRequest,
    engine_request: EngineRequest,
    turn: _Turn,
) -> web.StreamResponse:
    message_id = engine_request.request_id
    try:
        queue = worker.driver.submit(engine_request)
    except EngineUnavailableError as exc:
        raise ApiError(503, str(exc), type_="overloaded_error") from None
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    run = Run(queue, engine_request.prompt_tokens, worker.gpu_uuid)
    head = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": body.model,
        "stop_sequence": None,
    }
    try:
        if not body.stream:
            while not run.finished:
                await run.next()
            text = filler(0, run.completion_tokens)
            answer = {
                **head,
                "content": [_content(text, turn.tool, turn.call_id)],
                "stop_reason": turn.stop,
                "usage": _usage(run.usage()),
            }
            return web.json_response(answer)
        return await _stream(request, worker, run, head, turn)
    finally:
        settle(worker, run, message_id, turn.finish)


async def _stream(
    request: web.Request,
    worker: Worker,
    run: Run,
    head: dict[str, Any],
    turn: _Turn,
) -> web.StreamResponse:
    tool = turn.tool
    stream = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await stream.prepare(request)
    sender = ChunkSender(request, stream, worker)  # obeys the close_mid_stream fault
    sent = 0
    try:
        while not run.finished:
            event = await run.next()
            if isinstance(event, Tokens):
                if sent == 0:
                    await _open(sender, run, head, turn)
                text = filler(sent, event.count)
                sent += event.count
                if tool is None:
                    delta = {"type": "text_delta", "text": text}
                    await sender.write(_event("content_block_delta", {"index": 0, "delta": delta}))
                else:
                    await sender.write(_event("ping", {}))  # the input comes whole, at the end
        if sent == 0:
            await _open(sender, run, head, turn)
        if tool is not None:
            whole = json.dumps({"input": filler(0, run.completion_tokens)})
            delta = {"type": "input_json_delta", "partial_json": whole}
            await sender.write(_event("content_block_delta", {"index": 0, "delta": delta}))
        await sender.write(_event("content_block_stop", {"index": 0}))
        usage = _usage(run.usage())
        await sender.write(
            _event(
                "message_delta",
                {"delta": {"stop_reason": turn.stop, "stop_sequence": None}, "usage": usage},
            )
        )
        await sender.write(_event("message_stop", {}))
    except ConnectionError:
        return stream  # the client went away: the caller aborts the request
    await stream.write_eof()
    return stream


async def _open(sender: ChunkSender, run: Run, head: dict[str, Any], turn: _Turn) -> None:
    """``message_start`` (the input's usage, known once the first token is out) and the
    content block's start."""
    usage = _usage(Usage(run.prompt_tokens, 1, run.cached_tokens or 0))
    start = {**head, "content": [], "stop_reason": None, "usage": usage}
    await sender.write(_event("message_start", {"message": start}))
    block = _content("", turn.tool, turn.call_id)
    if turn.tool is not None:
        block["input"] = {}
    await sender.write(_event("content_block_start", {"index": 0, "content_block": block}))
