"""The ``tokenizers:`` section: how each model's prompts become the engine's tokens."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TokenizerConfig(BaseModel):
    """One model's tokenizer.

    Example::

        tokenizers:
          llama-3-8b: {kind: hf, path: /models/llama-3-8b}   # its tokenizer.json and config
          gemma-3-270m: {kind: worker}                        # ask the engine's /tokenize
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["none", "hf", "worker"] = "none"
    path: str | None = None
    """``hf``: the model's folder (``tokenizer.json``, ``tokenizer_config.json``) or its
    ``tokenizer.json``."""
    chat_template: str | None = None
    """``hf``: a chat template (Jinja) to use instead of ``tokenizer_config.json``'s."""
    chat_special_tokens: bool = False
    """``hf``: add the tokenizer's special tokens (a BOS) to a rendered chat too, as
    llama.cpp's server does; vLLM does not (the template writes them)."""
    library: Literal["auto", "gigatoken", "fastokens", "tokenizers"] = "auto"
    """``hf``: what tokenizes the rendered text: ``gigatoken`` or ``fastokens`` (Rust,
    the same ids, 20-30x faster than ``tokenizers``; ``auto`` uses the first installed
    that agrees with ``tokenizers`` at load) or ``tokenizers`` itself
    (``tokens.encoders``)."""
    reference_cache: str = "auto"
    """``hf`` with gigatoken or fastokens: where ``tokenizers``' facts of the file
    (its ids of a probe, its added tokens) are kept by the file's digest, so a restart
    skips computing them (~2 s of CPU, ~370 MB): ``auto``,
    ``$XDG_CACHE_HOME/kvgate/tokenizers`` (or ``~/.cache/...``; a relative
    ``XDG_CACHE_HOME`` is ignored, as XDG says); ``off``; or a folder
    (``tokens.factcache``)."""
    cache_entries: int = Field(default=4096, ge=0)
    """``worker``: answers remembered (least recently used forgotten first)."""
    timeout_s: float = Field(default=2.0, gt=0)
    """``worker``: how long one ``/tokenize`` may take before the request goes on
    without tokens (matched by characters)."""
