"""Every model's tokenizer, and a request's tokens by its model's.

Tokenizing never fails a request: a tokenizer that cannot answer (a worker down, a
template that raises) leaves the request without tokens, matched by characters as
if no tokenizer were configured; the failure is counted and logged once per model.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from kvgate.tokens.config import TokenizerConfig
from kvgate.tokens.hf import HFTokenizer
from kvgate.tokens.remote import Post, WorkerTokenizer

logger = logging.getLogger(__name__)

Endpoint = Literal["chat", "completions", "messages"]


class Tokenizers:
    """The configured tokenizers by model (models without one get no tokens)."""

    def __init__(
        self,
        configs: Mapping[str, TokenizerConfig],
        engines: Mapping[str, Literal["openai", "llamacpp"]] | None = None,
    ) -> None:
        self._hf: dict[str, HFTokenizer] = {}
        self._worker: dict[str, WorkerTokenizer] = {}
        engines = engines or {}
        for model, config in configs.items():
            if config.kind == "hf":
                self._hf[model] = HFTokenizer(config)
            elif config.kind == "worker":
                engine = engines.get(model, "openai")
                self._worker[model] = WorkerTokenizer(engine, config.cache_entries)
        self.failures = 0
        self._warned: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self._hf or self._worker)

    def wants_worker(self, model: str) -> bool:
        """Whether ``model``'s tokens are asked of one of its workers."""
        return model in self._worker

    async def tokens(
        self, model: str, endpoint: Endpoint, payload: Mapping[str, Any], post: Post | None
    ) -> tuple[int, ...]:
        """The request's prompt tokens (empty: no tokenizer, or it failed)."""
        if endpoint not in ("chat", "completions"):
            return ()  # Anthropic's Messages reach engines in their own shape
        try:
            hf = self._hf.get(model)
            if hf is not None:
                if endpoint == "completions":
                    return tuple(hf.completion(payload["prompt"]))
                return tuple(hf.chat(payload["messages"], **_chat_extra(payload)))
            worker = self._worker.get(model)
            if worker is None or post is None:
                return ()
            if endpoint == "completions":
                return await worker.completion(model, payload["prompt"], post)
            return await worker.chat(model, list(payload["messages"]), post)
        except Exception as exc:  # any tokenizer's failure: go on by characters
            self.failures += 1
            if model not in self._warned:
                self._warned.add(model)
                logger.warning("tokenizer of %s failed (%s); matched by characters", model, exc)
            return ()


def _chat_extra(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Template variables a request may set (tools, and vLLM's chat_template_kwargs)."""
    extra: dict[str, Any] = {}
    if payload.get("tools"):
        extra["tools"] = payload["tools"]
    kwargs = payload.get("chat_template_kwargs")
    if isinstance(kwargs, Mapping):
        extra.update({k: v for k, v in kwargs.items() if isinstance(k, str)})
    return extra
