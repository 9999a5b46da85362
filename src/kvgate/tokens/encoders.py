"""Text to a ``tokenizer.json``'s ids: ``fastokens`` where it agrees, else ``tokenizers``.

Hugging Face's ``tokenizers`` merges a SentencePiece-style BPE without a
pre-tokenizer (Gemma's, and every vocabulary ``realengine.tokenizer`` writes from a
GGUF) as one word per span between added tokens: about 5 ms of CPU for a 4k-token
chat on this project's 2-core machine, ten times the target. ``fastokens`` (PyPI,
Rust) reads the same ``tokenizer.json`` and gives the same ids in about 0.3 ms
(``benchmarks/kv_events_bench.py``). Its ids are checked at load against
``tokenizers``' on a probe of the cases where BPE implementations part
(``tokens.reference``, computed in a child process while fastokens loads: the
gateway holds one vocabulary, not two; kept by the file's digest, ``tokens.factcache``,
so a restart skips the child); a tokenizer it does not load or disagrees on
stays with ``tokenizers`` (``library: auto``, one warning logged), or fails to load
(``library: fastokens``). Exactness beyond the probe is the tests' (a property test
against ``tokenizers`` and llama.cpp's own ids in ``tests/realengine``).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from kvgate.tokens.factcache import FactCache
from kvgate.tokens.reference import PROBE, Apart, Reference, ReferenceLoadError, facts, load

logger = logging.getLogger(__name__)

Encode = Callable[[str], list[int]]
"""``encode(text)``: the ids of ``text`` without the post-processor's special tokens."""

Library = Literal["auto", "fastokens", "tokenizers"]


class EncoderLoadError(ValueError):
    """``library: fastokens`` was asked for and cannot be used."""


def hf_encoder(tokenizer: Any) -> Encode:
    """``tokenizers``' own encoding (the reference)."""

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    return encode


def encoder(
    file: Path, library: Library = "auto", cache: FactCache | None = None
) -> tuple[Encode, str, Reference]:
    """The encoder for ``file``, its library's name and ``tokenizers``' facts of it;
    ``auto``: ``fastokens`` if installed and agreeing on ``PROBE``. ``cache``: where
    the facts are kept by the file's digest (``tokens.factcache``), so a restart skips
    the child."""
    try:
        return _choose(file, library, cache)
    finally:
        give_back_freed_memory()


def _choose(file: Path, library: Library, cache: FactCache | None) -> tuple[Encode, str, Reference]:
    if library == "tokenizers":
        return _reference(file)
    try:
        import fastokens
    except ImportError:
        if library == "fastokens":
            raise EncoderLoadError("library 'fastokens' is not installed") from None
        return _reference(file)
    key = cache.key(file) if cache is not None else ""
    reference = cache.get(key) if cache is not None else None
    with Apart(file, start=reference is None) as apart:
        try:
            fast = fastokens.Tokenizer.from_file(str(file))
        except Exception as exc:  # a tokenizer.json it does not support
            apart.cancel()
            return _fallback(library, f"fastokens cannot load {file}: {exc}", file)
        if reference is None:
            try:
                reference = apart.result()
            except ReferenceLoadError as exc:
                why = f"no tokenizers ids to check fastokens by ({exc})"
                return _fallback(library, why, file)
            if cache is not None:
                cache.put(key, reference)

    def candidate(text: str) -> list[int]:
        ids: list[int] = fast.encode(text, add_special_tokens=False).ids
        return ids

    for text, ids in zip(PROBE, reference.probe, strict=True):
        if tuple(candidate(text)) != ids:
            why = f"fastokens disagrees with tokenizers on {text!r}"
            found = _fallback(library, why, file)
            if cache is not None and found[2] != reference:
                cache.put(key, found[2])  # the kept facts were wrong: keep the true ones
            return found
    return candidate, "fastokens", reference


def _reference(file: Path) -> tuple[Encode, str, Reference]:
    tokenizer = load(file)
    return hf_encoder(tokenizer), "tokenizers", facts(tokenizer)


def _fallback(library: Library, why: str, file: Path) -> tuple[Encode, str, Reference]:
    if library == "fastokens":
        raise EncoderLoadError(why)
    logger.warning("%s; tokenizing with tokenizers", why)
    return _reference(file)


def give_back_freed_memory() -> None:
    """Return to the system the heap a load freed: glibc keeps what parsing a
    ``tokenizer.json`` freed (Gemma's: ~215 MB after fastokens' load, RSS 359 -> 144
    MB), where ``malloc_trim`` exists (glibc)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError, TypeError):
        return
    trim(0)
