"""Text to a ``tokenizer.json``'s ids: the fastest library that agrees, else ``tokenizers``.

Hugging Face's ``tokenizers`` merges a SentencePiece-style BPE without a
pre-tokenizer (Gemma's, and every vocabulary ``realengine.tokenizer`` writes from a
GGUF) as one word per span between added tokens: about 6 ms of CPU for a 4k-token
chat on this project's 2-core machine, twelve times the target. Two Rust libraries on
PyPI read the same ``tokenizer.json`` and give the same ids (``CANDIDATES``, in order
of preference): ``gigatoken`` (a 3,700-token chat of real prose in ~0.2 ms, loads in
2 s and ~90 MB) and ``fastokens`` (~0.55 ms, 4 s and ~190 MB;
``benchmarks/kv_events_bench.py``). A candidate's ids are checked at load against
``tokenizers``' on a probe of the cases where BPE implementations part
(``tokens.reference``, computed in a child process while the candidate loads: the
gateway holds one vocabulary, not two; kept by the file's digest,
``tokens.factcache``, so a restart skips the child); one it does not load or that
disagrees is passed over for the next (``library: auto``, one warning logged), or
fails the load (``library: gigatoken`` / ``fastokens``). Exactness beyond the probe
is the tests' (property tests against ``tokenizers`` and llama.cpp's own ids in
``tests/realengine``).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from kvgate.tokens.factcache import FactCache
from kvgate.tokens.reference import PROBE, Apart, Reference, ReferenceLoadError, facts, load

logger = logging.getLogger(__name__)

Encode = Callable[[str], list[int]]
"""``encode(text)``: the ids of ``text`` without the post-processor's special tokens."""

Library = Literal["auto", "gigatoken", "fastokens", "tokenizers"]


class EncoderLoadError(ValueError):
    """A library was asked for by name and cannot be used."""


def hf_encoder(tokenizer: Any) -> Encode:
    """``tokenizers``' own encoding (the reference)."""

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    return encode


def _gigatoken(file: Path) -> Encode:
    import gigatoken

    tokenizer = gigatoken.Tokenizer.from_json(file.read_bytes())

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text).tolist()
        return ids

    return encode


def _fastokens(file: Path) -> Encode:
    import fastokens

    tokenizer = fastokens.Tokenizer.from_file(str(file))

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    return encode


CANDIDATES: dict[str, Callable[[Path], Encode]] = {
    "gigatoken": _gigatoken,
    "fastokens": _fastokens,
}
"""The libraries faster than ``tokenizers``, by name, in the order ``auto`` tries them."""


def installed_library(name: str) -> bool:
    """Whether the library ``name`` can be imported here."""
    return importlib.util.find_spec(name) is not None


def encoder(
    file: Path, library: Library = "auto", cache: FactCache | None = None
) -> tuple[Encode, str, Reference]:
    """The encoder for ``file``, its library's name and ``tokenizers``' facts of it;
    ``auto``: the first of ``CANDIDATES`` installed and agreeing on ``PROBE``.
    ``cache``: where the facts are kept by the file's digest (``tokens.factcache``),
    so a restart skips the child."""
    try:
        return _choose(file, library, cache)
    finally:
        give_back_freed_memory()


def _choose(file: Path, library: Library, cache: FactCache | None) -> tuple[Encode, str, Reference]:
    if library == "tokenizers":
        return _reference(file)
    names = list(CANDIDATES) if library == "auto" else [library]
    installed = [name for name in names if installed_library(name)]
    if not installed:
        if library != "auto":
            raise EncoderLoadError(f"library {library!r} is not installed")
        return _reference(file)
    key = cache.key(file) if cache is not None else ""
    kept = reference = cache.get(key) if cache is not None else None
    passed_over: list[str] = []
    disagreed = False
    with Apart(file, start=reference is None) as apart:
        for name in installed:
            try:
                encode = CANDIDATES[name](file)
            except Exception as exc:  # a tokenizer.json it does not support
                passed_over.append(f"{name} cannot load {file}: {exc}")
                continue
            if reference is None:
                try:
                    reference = apart.result()
                except ReferenceLoadError as exc:
                    why = f"no tokenizers ids to check {name} by ({exc})"
                    return _fallback(library, why, file)
                if cache is not None:
                    cache.put(key, reference)
            wrong = [
                t for t, ids in zip(PROBE, reference.probe, strict=True) if encode(t) != list(ids)
            ]
            if not wrong:
                for why in passed_over:
                    logger.warning("%s; tokenizing with %s", why, name)
                return encode, name, reference
            passed_over.append(f"{name} disagrees with tokenizers on {wrong[0]!r}")
            disagreed = True
    if kept is not None and cache is not None and disagreed:
        # The kept facts, not the libraries, may be wrong (a stale or forged file): judge
        # by the child's, and keep those (else every start fails, or tokenizes slowly).
        logger.warning("the kept facts of %s are not the libraries' ids: computing them", file)
        found = _choose(file, library, None)
        if found[2] != kept:
            cache.put(key, found[2])
        return found
    return _fallback(library, "; ".join(passed_over), file)


def _reference(file: Path) -> tuple[Encode, str, Reference]:
    tokenizer = load(file)
    return hf_encoder(tokenizer), "tokenizers", facts(tokenizer)


def _fallback(library: Library, why: str, file: Path) -> tuple[Encode, str, Reference]:
    if library != "auto":
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
