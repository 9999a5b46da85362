"""The engine's own deterministic tokenizer: text -> token ids, about 4 characters a token.

Words and punctuation runs are split like a BPE vocabulary would roughly split them
(long words into 4-character pieces) and each piece is hashed to an id. It is
deliberately unlike the gateway's 256-character block scheme: the gateway has to
infer the engine's cache state from the outside, never share it.

Tokenizing is the emulated worker's largest CPU cost, so the text is cut at its
spaces (no piece spans one) and the ids of each space-separated part are memoised
in a bounded LRU: prompts repeat their words, and a hit costs one dict lookup
instead of a regex scan plus slicing, encoding and hashing every piece.
"""

from __future__ import annotations

import functools
import re
from itertools import chain, islice

import xxhash

VOCAB_SIZE = 128_256
"""Size of the id space (Llama-3's vocabulary size, for realism of ids only)."""

PIECE_CHARS = 4
"""Long words are cut into pieces of this many characters (English BPE averages ~4)."""

PART_CACHE_SIZE = 65_536
"""Space-separated parts whose ids are memoised (least recently used dropped first)."""

LONGEST_CACHED = 64
"""Parts longer than this many characters are tokenized without the cache.

It bounds the cache's memory (entries times this), and long runs without a space
(base64, minified JSON) rarely repeat anyway.
"""

_PIECES = re.compile(r"\w+|[^\w\s]+|\n")
_SEED = 0x6B76_6761  # "kvga": keeps ids apart from any other xxhash use in kvgate


def _scan(text: str) -> tuple[int, ...]:
    """Token ids of ``text`` by the definition: every piece hashed, nothing memoised."""
    ids: list[int] = []
    append = ids.append
    digest = xxhash.xxh32_intdigest
    for match in _PIECES.finditer(text):
        piece = match.group()
        # A leading space is part of the token in BPE vocabularies, so " the" and
        # "the" differ; the start offset tells whether whitespace preceded.
        lead = " " if match.start() and text[match.start() - 1].isspace() else ""
        append(digest((lead + piece[:PIECE_CHARS]).encode(), _SEED) % VOCAB_SIZE)
        for start in range(PIECE_CHARS, len(piece), PIECE_CHARS):
            append(digest(piece[start : start + PIECE_CHARS].encode(), _SEED) % VOCAB_SIZE)
    return tuple(ids)


@functools.lru_cache(maxsize=PART_CACHE_SIZE)
def _first_part_ids(part: str) -> tuple[int, ...]:
    """Ids of the text's first space-separated part (nothing precedes it)."""
    return _scan(part)


@functools.lru_cache(maxsize=PART_CACHE_SIZE)
def _later_part_ids(part: str) -> tuple[int, ...]:
    """Ids of a space-separated part after the first: a space precedes it."""
    return _scan(" " + part)


def tokenize(text: str) -> list[int]:
    """Token ids of ``text``; the same text always gives the same ids.

    Cutting at spaces changes nothing: no piece holds a space, and a part after the
    first sees a space before it, as in the whole text. The caches hold pure
    functions' results, so they never change an answer either.
    """
    parts = text.split(" ")
    if max(map(len, parts)) > LONGEST_CACHED:
        return _tokenize_long(parts)
    later = chain.from_iterable(map(_later_part_ids, islice(parts, 1, None)))
    return [*_first_part_ids(parts[0]), *later]


def _tokenize_long(parts: list[str]) -> list[int]:
    """``tokenize`` for text with long parts: those bypass the cache."""
    first = parts[0]
    ids = list(_first_part_ids(first) if len(first) <= LONGEST_CACHED else _scan(first))
    for part in islice(parts, 1, None):
        ids.extend(_later_part_ids(part) if len(part) <= LONGEST_CACHED else _scan(" " + part))
    return ids


def count_tokens(text: str) -> int:
    """How many tokens ``tokenize(text)`` returns, without building the ids."""
    pieces = _PIECES.findall(text)
    # A piece is ceil(len / PIECE_CHARS) tokens: its first, plus (len - 1) // PIECE_CHARS.
    return len(pieces) + sum((len(p) - 1) // PIECE_CHARS for p in pieces)
