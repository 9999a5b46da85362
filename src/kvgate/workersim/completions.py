"""``POST /v1/chat/completions`` and ``POST /v1/completions``, streamed or not.

Each request is submitted to the engine and answered from its events: one stream
chunk per engine step, usage from the engine's cached-token count. A client that
goes away before its answer is complete is aborted in the engine, freeing its
blocks as vLLM does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from kvgate.engine.records import EngineRequest, FinishedRequest
from kvgate.workersim.driver import (
    EngineFailed,
    EngineUnavailableError,
    Event,
    Finished,
    FirstToken,
    Tokens,
)
from kvgate.workersim.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    read_body,
)
from kvgate.workersim.responses import (
    SSE_DONE,
    Endpoint,
    ResponseHeader,
    Usage,
    filler,
    sse_event,
)
from kvgate.workersim.slotapi import requested_slot
from kvgate.workersim.worker import WORKER_KEY, Worker


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    body = await read_body(request, ChatCompletionRequest)
    return await _serve(request, body, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``."""
    body = await read_body(request, CompletionRequest)
    return await _serve(request, body, "completion")


class Run:
    """One request's progress through the engine, as its events report it."""

    def __init__(
        self, queue: asyncio.Queue[Event], prompt_tokens: int, served_by: str | None = None
    ) -> None:
        self.queue = queue
        self.prompt_tokens = prompt_tokens
        self.served_by = served_by
        """The worker's own name for itself, reported in ``usage.kvgate_timing``."""
        self.cached_tokens: int | None = None
        self.completion_tokens = 0
        self.finished = False
        self.info: FinishedRequest | None = None

    async def next(self) -> Event:
        """The next event; raises ``ApiError(500)`` if the engine died."""
        event = await self.queue.get()
        if isinstance(event, EngineFailed):
            raise ApiError(500, "the engine failed", type_="internal_server_error")
        if isinstance(event, FirstToken) and self.cached_tokens is None:
            self.cached_tokens = event.cached_tokens
        elif isinstance(event, Tokens):
            self.completion_tokens += event.count
        elif isinstance(event, Finished):
            self.finished = True
            self.info = event.info
        return event

    def usage(self) -> Usage:
        """Usage as the engine reported it."""
        if self.info is not None:
            info = self.info
            return Usage(
                info.prompt_tokens,
                info.output_tokens,
                info.cached_tokens,
                ttft_s=info.ttft,
                e2e_s=info.e2e,
                worker=self.served_by,
            )
        return Usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens or 0)


async def _serve(
    request: web.Request, body: ChatCompletionRequest | CompletionRequest, endpoint: Endpoint
) -> web.StreamResponse:
    worker = request.app[WORKER_KEY]
    worker.check_model(body.model)
    faults = worker.faults
    if faults.settings.hang:
        faults.note("hang")
        await asyncio.Event().wait()  # until the client or the server gives up
    if faults.draw_error():
        raise ApiError(
            500, "injected fault: internal error", type_="internal_server_error", code="fault"
        )
    prompt = body.parsed_prompt()
    prompt_tokens = len(prompt.tokens)
    max_tokens, finish_reason = worker.output_budget(body.requested_output(), prompt_tokens)
    if isinstance(body, ChatCompletionRequest) and body.forces_tool_call() is not None:
        finish_reason = "tool_calls"  # an agent's turn ends calling its tool
    prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
    request_id = worker.new_request_id(prefix)
    session_id = request.headers.get(worker.options.session_header) or body.user
    engine_request = worker.engine_request(request_id, prompt, max_tokens, session_id)
    if faults.settings.extra_latency_ms > 0:
        faults.note("extra_latency")
        await asyncio.sleep(faults.settings.extra_latency_ms / 1000.0)
    table = worker.slot_table
    if table is None:
        return await _run(request, worker, body, endpoint, engine_request, finish=finish_reason)
    # A llama.cpp server: the request runs in one slot, against that slot's KV only.
    slot = await table.acquire(
        requested_slot(body.model_extra, table),
        list(engine_request.block_hashes),
        task=worker.requests_started,
    )
    try:
        pinned = table.begin(slot, engine_request)
        return await _run(request, worker, body, endpoint, pinned, finish=finish_reason)
    finally:
        table.release(slot)


async def _run(
    request: web.Request,
    worker: Worker,
    body: ChatCompletionRequest | CompletionRequest,
    endpoint: Endpoint,
    engine_request: EngineRequest,
    *,
    finish: str,
) -> web.StreamResponse:
    finish_reason = finish
    prompt_tokens = engine_request.prompt_tokens
    request_id = engine_request.request_id
    try:
        queue = worker.driver.submit(engine_request)
    except EngineUnavailableError as exc:
        raise ApiError(503, str(exc), type_="service_unavailable") from None
    except ValueError as exc:  # the engine refuses what it could never hold
        raise ApiError(400, str(exc), code="context_length_exceeded") from None
    run = Run(queue, prompt_tokens, worker.gpu_uuid)
    header = ResponseHeader(request_id, worker.created(), body.model, endpoint)
    tool = body.forces_tool_call() if isinstance(body, ChatCompletionRequest) else None
    try:
        if body.stream:
            return await _stream(
                request,
                worker,
                run,
                header,
                finish_reason=finish_reason,
                usage=body.include_usage,
                continuous=body.continuous_usage,
                tool=tool,
            )
        return await _complete(run, header, finish_reason, tool)
    finally:
        settle(worker, run, request_id, finish_reason)


def settle(worker: Worker, run: Run, request_id: str, finish_reason: str) -> None:
    """Count the request's end; abort it in the engine if it did not finish."""
    if run.finished:
        worker.driver.release(request_id)
        worker.finished[finish_reason] += 1
    else:
        worker.driver.abort(request_id)
        worker.finished["abort"] += 1


async def _complete(
    run: Run, header: ResponseHeader, finish_reason: str, tool: str | None
) -> web.Response:
    while not run.finished:
        await run.next()
    text = filler(0, run.completion_tokens)
    return _json(header.completion(text, finish_reason, run.usage(), tool))


async def _stream(
    request: web.Request,
    worker: Worker,
    run: Run,
    header: ResponseHeader,
    *,
    finish_reason: str,
    usage: bool,
    continuous: bool = False,
    tool: str | None = None,
) -> web.StreamResponse:
    include_usage = usage

    def counted(chunk: dict[str, Any]) -> dict[str, Any]:
        # vLLM's continuous_usage_stats: every chunk carries the counts so far.
        if continuous:
            chunk["usage"] = run.usage().body()
        return chunk

    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    sender = ChunkSender(request, response, worker)
    try:
        sent_tokens = 0
        if header.endpoint == "chat":
            await sender.send(counted(header.chunk("", role=True, with_usage_field=include_usage)))
        while not run.finished:
            event = await run.next()
            if isinstance(event, Tokens):
                text = filler(sent_tokens, event.count)
                sent_tokens += event.count
                await sender.send(counted(header.chunk(text, with_usage_field=include_usage)))
        if tool is not None:
            call = {"index": 0, **header.tool_call(tool, filler(0, sent_tokens))}
            chunk = header.chunk(None, with_usage_field=include_usage)
            chunk["choices"][0]["delta"]["tool_calls"] = [call]
            await sender.send(counted(chunk))
        final = header.chunk(
            None if header.endpoint == "chat" else "",
            finish_reason=finish_reason,
            with_usage_field=include_usage,
        )
        await sender.send(counted(final))
        if include_usage:
            await sender.send(header.usage_chunk(run.usage()))
        await sender.write(SSE_DONE)
    except ConnectionError:
        # The client went away (or a fault dropped it): the caller aborts the
        # request; aiohttp quietly finishes a response whose connection is gone.
        return response
    await response.write_eof()
    return response


class ChunkSender:
    """Writes stream chunks, dropping the connection when the fault says so."""

    def __init__(self, request: web.Request, response: web.StreamResponse, worker: Worker) -> None:
        self._request = request
        self._response = response
        self._worker = worker
        self._sent = 0

    async def send(self, payload: dict[str, Any]) -> None:
        """One chunk as a server-sent event."""
        await self.write(sse_event(payload))

    async def write(self, data: bytes) -> None:
        """Write raw bytes, or drop the connection if ``close_mid_stream_after`` is due."""
        limit = self._worker.faults.settings.close_mid_stream_after
        if limit is not None and self._sent >= limit:
            self._worker.faults.note("close_mid_stream")
            transport = self._request.transport
            if transport is not None:
                transport.abort()
            raise ConnectionResetError("connection dropped by close_mid_stream fault")
        await self._response.write(data)
        self._sent += 1


def _json(payload: dict[str, Any]) -> web.Response:
    return web.Response(
        body=json.dumps(payload, separators=(",", ":")).encode(),
        content_type="application/json",
    )
