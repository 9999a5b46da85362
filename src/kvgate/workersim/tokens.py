"""Token-level endpoints of the emulated worker: ``/tokenize``, ``/detokenize``, embeddings.

They follow vLLM's shapes (``/tokenize`` answers ``tokens``, ``count`` and
``max_model_len``; ``/detokenize`` answers ``prompt``) so a client written for
vLLM works against the emulation. The engine's tokenizer hashes text one way, so
``/detokenize`` can only name tokens this worker has seen: every space-separated
part ``/tokenize`` cut is remembered (a bounded map) with its ids; an id never
seen comes back as ``<id>``. Embeddings are deterministic unit vectors drawn
from the input's token ids, enough for a client to see shape and determinism.
"""

from __future__ import annotations

import base64
import struct
from collections import OrderedDict
from typing import Any, Literal

import xxhash
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from kvgate.engine.tokenizer import tokenize
from kvgate.workersim.protocol import ApiError, ChatMessage, read_body, render_chat
from kvgate.workersim.worker import WORKER_KEY

EMBEDDING_DIM = 64
"""Length of every embedding vector the emulated worker returns."""

KNOWN_PIECES = 65_536
"""Token ids whose text ``/detokenize`` remembers (oldest forgotten first)."""


class Vocabulary:
    """Text of the token ids this worker has cut, so ``/detokenize`` can give it back."""

    def __init__(self, limit: int = KNOWN_PIECES) -> None:
        self._limit = limit
        self._text: OrderedDict[int, str] = OrderedDict()

    def cut(self, text: str) -> list[int]:
        """``tokenize(text)``, remembering which text each id came from."""
        ids: list[int] = []
        for index, part in enumerate(text.split(" ")):
            spoken = part if index == 0 else " " + part
            part_ids = tokenize(spoken) if index == 0 else tokenize("x" + spoken)[1:]
            if part_ids:
                self._remember(part_ids[0], spoken)
                for later in part_ids[1:]:
                    self._remember(later, "")
            ids.extend(part_ids)
        return ids

    def text(self, ids: list[int]) -> str:
        """The text of ``ids``; ids never cut here read ``<id>``."""
        return "".join(self._text.get(i, f"<{i}>") for i in ids)

    def _remember(self, token: int, text: str) -> None:
        if token in self._text and self._text[token] != text and not text:
            return  # a continuation piece never overwrites a word's text
        self._text[token] = text
        self._text.move_to_end(token)
        if len(self._text) > self._limit:
            self._text.popitem(last=False)


VOCABULARY_KEY = web.AppKey("kvgate.workersim.vocabulary", Vocabulary)


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: a ``prompt`` or chat ``messages``."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int]


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``: one text or many, or token ids."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=EMBEDDING_DIM)


def _check(request: web.Request, model: str | None) -> None:
    if model is not None:
        request.app[WORKER_KEY].check_model(model)


async def tokenize_endpoint(request: web.Request) -> web.Response:
    """``POST /tokenize``."""
    body = await read_body(request, TokenizeRequest)
    _check(request, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(400, "give exactly one of 'prompt' and 'messages'", param="prompt")
    text = body.prompt if body.prompt is not None else render_chat(body.messages or [])
    ids = request.app[VOCABULARY_KEY].cut(text)
    limit = request.app[WORKER_KEY].context_limit
    return web.json_response({"count": len(ids), "max_model_len": limit, "tokens": ids})


async def detokenize_endpoint(request: web.Request) -> web.Response:
    """``POST /detokenize``."""
    body = await read_body(request, DetokenizeRequest)
    _check(request, body.model)
    return web.json_response({"prompt": request.app[VOCABULARY_KEY].text(body.tokens)})


def embedding(tokens: list[int], dimensions: int = EMBEDDING_DIM) -> list[float]:
    """A deterministic unit vector for ``tokens`` (equal inputs, equal vectors)."""
    seed = xxhash.xxh64_intdigest(struct.pack(f"<{len(tokens)}q", *tokens))
    raw = [((seed >> (i % 48)) ^ xxhash.xxh32_intdigest(bytes([i]), seed & 0xFFFF)) % 2001 - 1000
           for i in range(dimensions)]  # fmt: skip
    norm = sum(v * v for v in raw) ** 0.5 or 1.0
    return [v / norm for v in raw]


def _inputs(value: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
    if isinstance(value, str):
        return [tokenize(value)]
    if not value:
        raise ApiError(400, "'input' must not be empty", param="input")
    if all(isinstance(v, int) for v in value):
        return [[int(v) for v in value]]  # type: ignore[arg-type]
    return [tokenize(v) if isinstance(v, str) else list(v) for v in value]  # type: ignore[arg-type]


async def embeddings_endpoint(request: web.Request) -> web.Response:
    """``POST /v1/embeddings``: OpenAI's ``list`` of ``embedding`` objects."""
    body = await read_body(request, EmbeddingRequest)
    worker = request.app[WORKER_KEY]
    worker.check_model(body.model)
    inputs = _inputs(body.input)
    data: list[dict[str, Any]] = []
    for index, tokens in enumerate(inputs):
        if len(tokens) >= worker.context_limit:
            raise ApiError(400, f"input {index} is longer than the context", param="input")
        vector = embedding(tokens, body.dimensions or EMBEDDING_DIM)
        encoded: list[float] | str = vector
        if body.encoding_format == "base64":
            encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    used = sum(len(t) for t in inputs)
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "model": body.model,
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }
    )
