"""The OpenAI request bodies the worker accepts, and its OpenAI-shaped errors.

Requests are validated by pydantic models that allow unknown fields (clients send
sampling parameters the emulation ignores); anything malformed becomes an
``ApiError`` with status 400, never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvgate.core.messages import canonical_json
from kvgate.engine.tokenizer import tokenize

_Model = TypeVar("_Model", bound=BaseModel)


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {message, type, code, param}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param

    def anthropic_body(self) -> dict[str, Any]:
        """The JSON body Anthropic's Messages API sends with this error."""
        kind = self.type
        if self.status == 404:
            kind = "not_found_error"
        elif self.status == 429:
            kind = "rate_limit_error"
        elif self.status == 503:
            kind = "overloaded_error"
        elif self.status >= 500:
            kind = "api_error"
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI sends with this error."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        """This error as an aiohttp response."""
        return web.json_response(self.body(), status=self.status)


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request's prompt: its tokens, and its text when it was given as text."""

    tokens: list[int]
    text: str | None

    @classmethod
    def of_text(cls, text: str) -> Prompt:
        """A text prompt, tokenized by the engine's tokenizer."""
        return cls(tokens=tokenize(text), text=text)


class TextPart(BaseModel):
    """One part of a multi-part message content; only text parts carry tokens."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One chat message; ``content`` may be a string, parts, or absent (tool calls)."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1)
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text, parts joined."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content if part.type == "text")


class StreamOptions(BaseModel):
    """``stream_options``: whether the final chunk carries ``usage`` (and, as vLLM's
    ``continuous_usage_stats`` asks, every chunk: the counts so far)."""

    model_config = ConfigDict(extra="allow")

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _GenerationRequest(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        """True when a streamed answer ends with a usage-only chunk."""
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """True when every chunk carries the usage so far (vLLM's
        ``continuous_usage_stats``, honoured with ``include_usage`` as vLLM does)."""
        options = self.stream_options
        return self.include_usage and options is not None and options.continuous_usage_stats

    def requested_output(self) -> int | None:
        """The output length the client asked for, if any."""
        return self.max_tokens


class ChatCompletionRequest(_GenerationRequest):
    """The body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def requested_output(self) -> int | None:
        """``max_completion_tokens`` wins over the deprecated ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens

    def parsed_prompt(self) -> Prompt:
        """The prompt as the engine sees it: the messages through the chat template."""
        extra = self.model_extra or {}
        return Prompt.of_text(render_chat(self.messages, extra.get("tools")))

    def forces_tool_call(self) -> str | None:
        """The tool this turn must call (``tool_choice`` required or named), if any."""
        extra = self.model_extra or {}
        return forced_tool(extra.get("tools"), extra.get("tool_choice"))


class CompletionRequest(_GenerationRequest):
    """The body of ``POST /v1/completions``; ``prompt`` is text or token ids."""

    prompt: str | list[str] | list[int] = Field(min_length=1)

    def parsed_prompt(self) -> Prompt:
        """Text is tokenized; a list of token ids is taken as the tokens themselves."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return Prompt.of_text(prompt)
        if all(isinstance(item, int) for item in prompt):
            return Prompt(tokens=[int(item) for item in prompt], text=None)
        if len(prompt) != 1:
            raise ApiError(400, "only one prompt per request is supported", param="prompt")
        return Prompt.of_text(str(prompt[0]))


def render_chat(messages: list[ChatMessage], tools: object = None) -> str:
    """Messages through a fixed chat template, ending with the assistant's turn.

    Fixed separators make a conversation's earlier turns a textual prefix of its
    later requests, so their KV blocks are shared as in a real engine. The tools come
    first and an assistant's tool calls after its text, as canonical JSON, so the same
    conversation sent through the Messages API renders to the same tokens.
    """
    parts = [f"<|tools|>\n{canonical_json(tools)}<|end|>\n"] if tools else []
    for m in messages:
        calls = (m.model_extra or {}).get("tool_calls")
        called = "".join(_call_text(call) for call in calls) if isinstance(calls, list) else ""
        parts.append(f"<|{m.role}|>\n{m.text()}{called}<|end|>\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def _call_text(call: object) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        return ""
    return f"<|call|>{fn.get('name', '')}{canonical_json(fn.get('arguments', ''))}"


def forced_tool(tools: object, choice: object) -> str | None:
    """The name of the tool a request's ``tool_choice`` makes it call, if it forces one.

    Chat's ``"required"`` or ``{"type": "function", "function": {"name"}}``, and the
    Messages API's ``{"type": "any"}`` or ``{"type": "tool", "name"}``: the emulated model
    then ends its turn calling that tool (the first one for "any tool").
    """
    if not isinstance(tools, list) or not tools:
        return None
    first = tools[0] if isinstance(tools[0], dict) else {}
    first_name = str(first.get("function", first).get("name", "tool"))
    if choice == "required":
        return first_name
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "any":
            return first_name
        if kind == "tool":
            return str(choice.get("name", first_name))
        if kind == "function" and isinstance(choice.get("function"), dict):
            return str(choice["function"].get("name", first_name))
    return None


async def read_body(request: web.Request, model: type[_Model]) -> _Model:
    """The request's JSON body validated as ``model``; ``ApiError(400)`` otherwise."""
    raw = await request.read()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def validation_error(exc: ValidationError) -> ApiError:
    """The first pydantic error as an OpenAI 400, naming the offending field."""
    first = exc.errors()[0]
    param = _param(first.get("loc", ()))
    message = first.get("msg", "invalid request")
    if first.get("type") == "missing":
        return ApiError(400, f"missing required parameter: {param!r}", param=param)
    return ApiError(400, f"invalid value for {param!r}: {message}", param=param)


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _param(loc: tuple[int | str, ...]) -> str | None:
    """The field path of a pydantic error, without the union-member tags it adds."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in _UNION_TAGS):
            break
        parts.append(str(part))
    return ".".join(parts) or None
