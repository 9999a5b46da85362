"""Text to a ``tokenizer.json``'s ids: ``fastokens`` where it agrees, else ``tokenizers``.

Hugging Face's ``tokenizers`` merges a SentencePiece-style BPE without a
pre-tokenizer (Gemma's, and every vocabulary ``realengine.tokenizer`` writes from a
GGUF) as one word per span between added tokens: about 5 ms of CPU for a 4k-token
chat on this project's 2-core machine, ten times the target. ``fastokens`` (PyPI,
Rust) reads the same ``tokenizer.json`` and gives the same ids in about 0.3 ms
(``benchmarks/kv_events_bench.py``). Its ids are checked against ``tokenizers``'
at load on a probe of the cases where BPE implementations part (byte fallback,
whitespace runs, added tokens, scripts without spaces); a tokenizer it does not
load or disagrees on stays with ``tokenizers`` (``library: auto``), or fails to load
(``library: fastokens``). Exactness beyond the probe is the tests' (a property test
against ``tokenizers`` and llama.cpp's own ids in ``tests/realengine``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

Encode = Callable[[str], list[int]]
"""``encode(text)``: the ids of ``text`` without the post-processor's special tokens."""

Library = Literal["auto", "fastokens", "tokenizers"]

PROBE = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading and trailing  \n\n\n\ttab\r\nCRLF   ",
    "日本語のテキスト、中文文本 and 한국어 🙂🚀 mixed; ÆØÅ ß ç ñ Ω ∑ √ — “q” …",
    "Numbers 3.14159, -42, 1e10, 0xFF 12345678901234567890",
    "<start_of_turn>user\nhi<end_of_turn>\n<bos><eos><table><td>x</td></table>",
    "def f(x):\n    return x ** 2  # square\n\n\n\n\n",
    "\x00\x01\x7f\u200b\ufeff\U0001f9ea\U000e0041 rare code points",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa b",
    "▁already▁marked▁ >▁</ > </",
)
"""Texts the candidate must tokenize as ``tokenizers`` does before it is used."""


class EncoderLoadError(ValueError):
    """``library: fastokens`` was asked for and cannot be used."""


def hf_encoder(tokenizer: Any) -> Encode:
    """``tokenizers``' own encoding (the reference)."""

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    return encode


def encoder(file: Path, tokenizer: Any, library: Library = "auto") -> tuple[Encode, str]:
    """The encoder for ``file`` (``tokenizer``: it loaded by ``tokenizers``) and its
    library's name; ``auto``: ``fastokens`` if installed and agreeing on ``PROBE``."""
    reference = hf_encoder(tokenizer)
    if library == "tokenizers":
        return reference, "tokenizers"
    try:
        import fastokens
    except ImportError:
        if library == "fastokens":
            raise EncoderLoadError("library 'fastokens' is not installed") from None
        return reference, "tokenizers"
    try:
        fast = fastokens.Tokenizer.from_file(str(file))
    except Exception as exc:  # a tokenizer.json it does not support
        return _fallback(library, f"fastokens cannot load {file}: {exc}", reference)

    def candidate(text: str) -> list[int]:
        ids: list[int] = fast.encode(text, add_special_tokens=False).ids
        return ids

    for text in PROBE:
        if candidate(text) != reference(text):
            return _fallback(library, f"fastokens disagrees with tokenizers on {text!r}", reference)
    return candidate, "fastokens"


def _fallback(library: Library, why: str, reference: Encode) -> tuple[Encode, str]:
    if library == "fastokens":
        raise EncoderLoadError(why)
    logger.warning("%s; tokenizing with tokenizers", why)
    return reference, "tokenizers"
