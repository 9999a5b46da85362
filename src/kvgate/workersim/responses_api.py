"""``POST /v1/responses``: OpenAI's Responses API on the emulated engine.

A response is generated like a chat completion (the input, after the earlier
turns, through the chat template), and its turns are kept under its id so a
later request naming it as ``previous_response_id`` continues the conversation,
as vLLM keeps them: in this worker's memory only. A ``previous_response_id``
this worker does not know is a 404, exactly what a real worker answers when a
router sends a continuation to a worker that never saw the conversation; that is
why the gateway keeps such requests on the worker that made the response.
Streaming sends the ``response.created``, ``response.output_text.delta`` and
``response.completed`` events.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from kvgate.workersim.completions import Run, settle
from kvgate.workersim.driver import EngineUnavailableError, Tokens
from kvgate.workersim.protocol import ApiError, ChatMessage, Prompt, read_body, render_chat
from kvgate.workersim.responses import Usage, filler, sse_event
from kvgate.workersim.worker import WORKER_KEY

KEPT_RESPONSES = 10_000
"""Responses whose conversation the worker keeps for ``previous_response_id``."""


class ResponseLog:
    """Each kept response's whole conversation, oldest forgotten first."""

    def __init__(self, limit: int = KEPT_RESPONSES) -> None:
        self._limit = limit
        self._turns: OrderedDict[str, list[ChatMessage]] = OrderedDict()
        self._answers: dict[str, dict[str, Any]] = {}

    def get(self, response_id: str) -> list[ChatMessage] | None:
        """The conversation up to and including ``response_id``'s answer."""
        return self._turns.get(response_id)

    def answer(self, response_id: str) -> dict[str, Any] | None:
        """The response object as it was answered (``GET /v1/responses/{id}``)."""
        return self._answers.get(response_id)

    def keep(
        self, response_id: str, turns: list[ChatMessage], answer: dict[str, Any] | None = None
    ) -> None:
        """Remember a response's conversation (and the response itself)."""
        self._turns[response_id] = turns
        if answer is not None:
            self._answers[response_id] = answer
        if len(self._turns) > self._limit:
            gone, _ = self._turns.popitem(last=False)
            self._answers.pop(gone, None)

    def drop(self, response_id: str) -> bool:
        """Forget a response (``DELETE /v1/responses/{id}``); False if it was not kept."""
        self._answers.pop(response_id, None)
        return self._turns.pop(response_id, None) is not None


RESPONSE_LOG_KEY = web.AppKey("kvgate.workersim.responses", ResponseLog)


class InputItem(BaseModel):
    """One input message (``{"role", "content"}``); other item types are read as text."""

    model_config = ConfigDict(extra="allow")
    role: str = "user"
    content: str | list[dict[str, Any]] = ""

    def message(self) -> ChatMessage:
        """The item as a chat message."""
        if isinstance(self.content, str):
            return ChatMessage(role=self.role, content=self.content)
        text = "".join(str(part.get("text", "")) for part in self.content)
        return ChatMessage(role=self.role, content=text)


class ResponseRequest(BaseModel):
    """The body of ``POST /v1/responses`` (the fields the emulation reads)."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    user: str | None = None
    store: bool = True


def _usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _response(
    response_id: str, created: int, body: ResponseRequest, text: str, *, status: str, usage: Usage
) -> dict[str, Any]:
    output = []
    if status == "completed":
        output.append(
            {
                "type": "message",
                "id": "msg_" + response_id[5:],
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": body.model,
        "output": output,
        "previous_response_id": body.previous_response_id,
        "instructions": body.instructions,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": _usage_body(usage) if status == "completed" else None,
    }


async def responses_endpoint(request: web.Request) -> web.StreamResponse:
    """``POST /v1/responses``."""
    body = await read_body(request, ResponseRequest)
    worker = request.app[WORKER_KEY]
    worker.check_model(body.model)
    log = request.app[RESPONSE_LOG_KEY]
    turns: list[ChatMessage] = []
    if body.previous_response_id is not None:
        earlier = log.get(body.previous_response_id)
        if earlier is None:
            raise ApiError(
                404,
                f"Response with id '{body.previous_response_id}' not found.",
                code="response_not_found",
                param="previous_response_id",
            )
        turns = list(earlier)
    if body.instructions:
        turns.insert(0, ChatMessage(role="system", content=body.instructions))
    if isinstance(body.input, str):
        turns.append(ChatMessage(role="user", content=body.input))
    else:
        turns.extend(item.message() for item in body.input)
    prompt = Prompt.of_text(render_chat(turns))
    max_tokens, finish = worker.output_budget(body.max_output_tokens, len(prompt.tokens))
    response_id = "resp_" + worker.new_request_id("r")[2:]
    session = request.headers.get(worker.options.session_header) or body.user
    try:
        queue = worker.driver.submit(
            worker.engine_request(response_id, prompt, max_tokens, session)
        )
    except EngineUnavailableError as exc:
        raise ApiError(503, str(exc), type_="service_unavailable") from None
    except ValueError as exc:
        raise ApiError(400, str(exc), code="context_length_exceeded") from None
    run = Run(queue, len(prompt.tokens), worker.gpu_uuid)
    created = worker.created()
    try:
        if body.stream:
            stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await stream.prepare(request)
            empty = Usage(0, 0, 0)
            start = _response(response_id, created, body, "", status="in_progress", usage=empty)
            await stream.write(sse_event({"type": "response.created", "response": start}))
            sent = 0
            while not run.finished:
                event = await run.next()
                if isinstance(event, Tokens):
                    delta = filler(sent, event.count)
                    sent += event.count
                    await stream.write(
                        sse_event(
                            {
                                "type": "response.output_text.delta",
                                "item_id": "msg_" + response_id[5:],
                                "output_index": 0,
                                "content_index": 0,
                                "delta": delta,
                            }
                        )
                    )
        else:
            while not run.finished:
                await run.next()
        text = filler(0, run.completion_tokens)
        done = _response(response_id, created, body, text, status="completed", usage=run.usage())
        if body.store:
            log.keep(response_id, [*turns, ChatMessage(role="assistant", content=text)], done)
        if body.stream:
            await stream.write(sse_event({"type": "response.completed", "response": done}))
            await stream.write_eof()
            return stream
        return web.json_response(done)
    finally:
        settle(worker, run, response_id, finish)


async def retrieve_endpoint(request: web.Request) -> web.Response:
    """``GET /v1/responses/{response_id}``: a stored response, from this worker's memory."""
    response_id = request.match_info["response_id"]
    answer = request.app[RESPONSE_LOG_KEY].answer(response_id)
    if answer is None:
        raise ApiError(
            404, f"Response with id '{response_id}' not found.", code="response_not_found"
        )
    return web.json_response(answer)


async def delete_endpoint(request: web.Request) -> web.Response:
    """``DELETE /v1/responses/{response_id}``: forget a stored response (OpenAI's answer)."""
    response_id = request.match_info["response_id"]
    if not request.app[RESPONSE_LOG_KEY].drop(response_id):
        raise ApiError(
            404, f"Response with id '{response_id}' not found.", code="response_not_found"
        )
    return web.json_response({"id": response_id, "object": "response", "deleted": True})
