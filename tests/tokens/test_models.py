"""Tokenizers by model: a worker's answers remembered, failures never fail a request."""

from __future__ import annotations

import json

from kvgate.tokens.config import TokenizerConfig
from kvgate.tokens.models import Tokenizers


async def test_worker_answers_are_remembered_and_failures_fall_back_to_none() -> None:
    asked: list[tuple[str, dict[str, object]]] = []

    async def post(path: str, body: bytes) -> tuple[int, bytes]:
        asked.append((path, json.loads(body)))
        return 200, json.dumps({"tokens": [1, 2, 3]}).encode()

    tokenizers = Tokenizers({"m": TokenizerConfig(kind="worker")})
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert await tokenizers.tokens("m", "chat", chat, post) == (1, 2, 3)
    assert await tokenizers.tokens("m", "chat", chat, post) == (1, 2, 3)
    assert len(asked) == 1 and asked[0][0] == "/tokenize"
    assert asked[0][1]["add_generation_prompt"] is True
    assert await tokenizers.tokens("m", "completions", {"prompt": [7, 8]}, post) == (7, 8)
    assert await tokenizers.tokens("other", "chat", chat, post) == ()
    assert await tokenizers.tokens("m", "messages", chat, post) == ()

    async def broken(path: str, body: bytes) -> tuple[int, bytes]:
        return 500, b"{}"

    fresh = {"messages": [{"role": "user", "content": "new"}]}
    assert await tokenizers.tokens("m", "chat", fresh, broken) == ()
    assert tokenizers.failures == 1


async def test_llamacpp_chats_are_rendered_then_tokenized_with_bos() -> None:
    asked: list[tuple[str, dict[str, object]]] = []

    async def post(path: str, body: bytes) -> tuple[int, bytes]:
        asked.append((path, json.loads(body)))
        if path == "/apply-template":
            return 200, b'{"prompt": "<|im_start|>user\\nhi<|im_end|>\\n"}'
        return 200, json.dumps({"tokens": [{"id": 2, "piece": "<bos>"}, 5]}).encode()

    tokenizers = Tokenizers({"g": TokenizerConfig(kind="worker")}, {"g": "llamacpp"})
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert await tokenizers.tokens("g", "chat", chat, post) == (2, 5)
    assert [p for p, _ in asked] == ["/apply-template", "/tokenize"]
    assert asked[1][1] == {
        "content": "<|im_start|>user\nhi<|im_end|>\n",
        "add_special": True,
        "parse_special": True,
    }
