"""The engine's own deterministic tokenizer: text -> token ids, about 4 characters a token.

Words and punctuation runs are split like a BPE vocabulary would roughly split them
(long words into 4-character pieces) and each piece is hashed to an id. It is
deliberately unlike the gateway's 256-character block scheme: the gateway has to
infer the engine's cache state from the outside, never share it.
"""

from __future__ import annotations

import re

import xxhash

VOCAB_SIZE = 128_256
"""Size of the id space (Llama-3's vocabulary size, for realism of ids only)."""

PIECE_CHARS = 4
"""Long words are cut into pieces of this many characters (English BPE averages ~4)."""

_PIECES = re.compile(r"\w+|[^\w\s]+|\n")
_SEED = 0x6B76_6761  # "kvga": keeps ids apart from any other xxhash use in kvgate


def tokenize(text: str) -> list[int]:
    """Token ids of ``text``; the same text always gives the same ids."""
    ids: list[int] = []
    append = ids.append
    digest = xxhash.xxh32_intdigest
    for match in _PIECES.finditer(text):
        piece = match.group()
        # A leading space is part of the token in BPE vocabularies, so " the" and
        # "the" differ; the start offset tells whether whitespace preceded.
        lead = " " if match.start() and text[match.start() - 1].isspace() else ""
        if len(piece) <= PIECE_CHARS:
            append(digest((lead + piece).encode(), _SEED) % VOCAB_SIZE)
            continue
        append(digest((lead + piece[:PIECE_CHARS]).encode(), _SEED) % VOCAB_SIZE)
        for start in range(PIECE_CHARS, len(piece), PIECE_CHARS):
            append(digest(piece[start : start + PIECE_CHARS].encode(), _SEED) % VOCAB_SIZE)
    return ids


def count_tokens(text: str) -> int:
    """How many tokens ``tokenize(text)`` returns, without building the ids."""
    total = 0
    for match in _PIECES.finditer(text):
        total += -(-len(match.group()) // PIECE_CHARS)
    return total
