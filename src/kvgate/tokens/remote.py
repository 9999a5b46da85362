"""``tokenizer: worker``: a worker of the model says what the tokens are.

vLLM (and the emulated worker) answer ``POST /tokenize`` with ``{"tokens": [...]}``
for a ``prompt`` or for chat ``messages`` (``add_generation_prompt``), tokenized as
the engine tokenizes the request. llama.cpp's ``/tokenize`` takes ``content`` only,
so a chat request is first rendered by its ``/apply-template``; the prompt is then
tokenized as its server tokenizes a request: special tokens parsed, and a BOS added
where the model adds one. Answers are remembered (bounded LRU) by the request's
prompt: the same prompt asks once.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import xxhash

Post = Callable[[str, bytes], Awaitable[tuple[int, bytes]]]
"""``post(path, body) -> (status, body)``: one short POST to a worker of the model."""


class TokenizeError(RuntimeError):
    """The worker did not say what the tokens are."""


class WorkerTokenizer:
    """Asks a worker's ``/tokenize`` (see the module docs), remembering answers."""

    def __init__(self, engine: Literal["openai", "llamacpp"], cache_entries: int = 4096) -> None:
        self.engine = engine
        self._limit = cache_entries
        self._cache: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self.asked = 0
        self.remembered = 0

    async def chat(self, model: str, messages: list[Any], post: Post) -> tuple[int, ...]:
        """A chat request's prompt tokens."""
        key = self._key("chat", model, messages)
        found = self._get(key)
        if found is not None:
            return found
        if self.engine == "llamacpp":
            rendered = await self._ask(post, "/apply-template", {"messages": messages})
            prompt = rendered.get("prompt")
            if not isinstance(prompt, str):
                raise TokenizeError("/apply-template answered no prompt")
            tokens = await self._llamacpp_tokens(post, prompt)
        else:
            body = {"model": model, "messages": messages, "add_generation_prompt": True}
            tokens = _tokens(await self._ask(post, "/tokenize", body))
        return self._put(key, tokens)

    async def completion(self, model: str, prompt: str | list[int], post: Post) -> tuple[int, ...]:
        """A completion request's prompt tokens."""
        if isinstance(prompt, list):
            return tuple(prompt)
        key = self._key("completion", model, prompt)
        found = self._get(key)
        if found is not None:
            return found
        if self.engine == "llamacpp":
            tokens = await self._llamacpp_tokens(post, prompt)
        else:
            tokens = _tokens(await self._ask(post, "/tokenize", {"model": model, "prompt": prompt}))
        return self._put(key, tokens)

    async def _llamacpp_tokens(self, post: Post, prompt: str) -> tuple[int, ...]:
        body = {"content": prompt, "add_special": True, "parse_special": True}
        return _tokens(await self._ask(post, "/tokenize", body))

    async def _ask(self, post: Post, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.asked += 1
        status, answer = await post(path, json.dumps(body).encode())
        if status != 200:
            raise TokenizeError(f"{path} answered {status}")
        try:
            data = json.loads(answer)
        except ValueError:
            raise TokenizeError(f"{path} answered no JSON") from None
        if not isinstance(data, dict):
            raise TokenizeError(f"{path} answered no object")
        return data

    @staticmethod
    def _key(kind: str, model: str, value: object) -> int:
        text = json.dumps([kind, model, value], separators=(",", ":"), sort_keys=True)
        return int(xxhash.xxh3_64_intdigest(text.encode()))

    def _get(self, key: int) -> tuple[int, ...] | None:
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
            self.remembered += 1
        return found

    def _put(self, key: int, tokens: tuple[int, ...]) -> tuple[int, ...]:
        if self._limit:
            self._cache[key] = tokens
            if len(self._cache) > self._limit:
                self._cache.popitem(last=False)
        return tokens


def _tokens(data: dict[str, Any]) -> tuple[int, ...]:
    tokens = data.get("tokens")
    if not isinstance(tokens, list):
        raise TokenizeError("/tokenize answered no tokens")
    # llama.cpp answers pieces as {"id", "piece"} objects when asked for them.
    ids = [t["id"] if isinstance(t, dict) else t for t in tokens]
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise TokenizeError("/tokenize answered tokens that are not ids")
    return tuple(ids)
