"""Prefix chains: chained xxh3-64 hashes of a prompt's blocks, and hashes of spans of its text.

See ``core.prefix`` for how a request's chain is cut (fine blocks, then coarse ones).

**Spans.** Past its fine blocks a chain is hashed in coarse blocks (``coarse_factor`` fine
blocks wide), so a long prompt costs few hashes. But a coarse block hides where in
it a prompt ends: a later turn carries the earlier turn's prompt and more, so its
chain holds a *whole* coarse block where the earlier turn had only a partial one,
and the two chains agree only up to the block before. When that block is text
strangers share (a tool preamble or a system prompt exactly as long as the fine
blocks), every new conversation looks like a continuation of every other.
``span_hashes`` hashes the text after a whole block, seeded with that block's hash,
so a policy can tell exactly how far past it two prompts agree
(``core.policies.lives``), only where it needs to, however long the prompts.

"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from kvgate.engine.blocks import token_bytes
from kvgate.types import BlockHash


def shared_blocks(a: Sequence[BlockHash], b: Sequence[BlockHash]) -> int:
    """How many leading blocks chains ``a`` and ``b`` share (chained hashes: the first
    difference ends the match)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def block_widths(width: int, fine_blocks: int, coarse_factor: int, length: int) -> list[int]:
    """Widths of the blocks covering ``length`` units: ``fine_blocks`` of ``width``, then coarse.

    The last block may be partial (it is hashed as it is).
    """
    fine_end = width * fine_blocks
    if length <= fine_end:
        return [width] * -(-length // width)
    coarse = width * coarse_factor
    return [width] * fine_blocks + [coarse] * -(-(length - fine_end) // coarse)


def chain_chars(depth: int, width: int, fine_blocks: int, coarse_factor: int) -> int:
    """Units (characters or tokens) covered by the first ``depth`` blocks of a chain."""
    if depth <= fine_blocks:
        return depth * width
    return (fine_blocks + (depth - fine_blocks) * coarse_factor) * width


def text_chain_hashes(
    text: str,
    block_chars: int,
    max_blocks: int,
    seed: int = 0,
    *,
    coarse_factor: int = 0,
    max_chars: int = 1 << 22,
) -> tuple[BlockHash, ...]:
    """Chained xxh3-64 hashes of ``text``: ``max_blocks`` blocks of ``block_chars``.

    With ``coarse_factor`` > 0 the chain goes on past them over the rest of the text
    (up to ``max_chars``) in blocks ``coarse_factor`` times wider; with 0 it stops.
    """
    return pieces_chain_hashes(
        (text,), block_chars, max_blocks, seed, coarse_factor=coarse_factor, max_chars=max_chars
    )


def pieces_chain_hashes(
    pieces: Sequence[str],
    block_chars: int,
    max_blocks: int,
    seed: int = 0,
    *,
    coarse_factor: int = 0,
    max_chars: int = 1 << 22,
) -> tuple[BlockHash, ...]:
    """``text_chain_hashes`` of ``"".join(pieces)``, without joining them.

    Each piece is encoded once if it is ASCII, and its blocks hashed as views of
    the buffer; any other piece block by block (``block_hash``), since blocks count
    characters. A block that spans pieces is joined from its parts. So a long
    prompt passed as its own piece (``chat_canonical_pieces``) is copied once, not
    three times: prompt-sized temporaries cost more than the hashing, as the
    allocator hands memory that large back to the system and each request faults
    it in again. Many tiny pieces are slower than their join: join those first.
    """
    # Conditionals, not ``min``/``max`` (keyword parsing on 3.11): this runs per request.
    end = sum(map(len, pieces))
    bound = max_chars if coarse_factor else block_chars * max_blocks
    end = bound if bound < end else end
    factor = coarse_factor if coarse_factor > 1 else 1
    widths = block_widths(block_chars, max_blocks, factor, end)
    if not widths:
        return ()
    widths[-1] = end - chain_chars(len(widths) - 1, block_chars, max_blocks, factor)
    hashes: list[int] = []
    h = seed
    digest = xxhash.xxh3_64_intdigest
    k = 0  # the next block to hash
    offset = 0  # where the piece starts in the text
    head: list[str] = []  # block k's start, from earlier pieces
    for whole in pieces:
        # Past max_chars nothing is hashed, so nothing is encoded either.
        piece = whole if offset + len(whole) <= end else whole[: end - offset]
        size = len(piece)
        stop = offset + size  # blocks k..last-1 end in this piece
        view = memoryview(piece.encode()) if piece.isascii() else None
        last = len(widths) if stop >= end else _blocks_in(stop, block_chars, max_blocks, factor)
        pos = 0
        if head and k < last:  # the block begun in earlier pieces ends here
            pos = chain_chars(k + 1, block_chars, max_blocks, factor) - offset
            head.append(piece[:pos])
            h = block_hash("".join(head), h)
            hashes.append(h)
            head.clear()
            k += 1
        run = widths if k == 0 and last == len(widths) else widths[k:last]
        if view is not None:
            for width in run:
                h = digest(view[pos : pos + width], h)
                hashes.append(h)
                pos += width
        else:
            for width in run:
                h = block_hash(piece[pos : pos + width], h)
                hashes.append(h)
                pos += width
        k = last
        if k == len(widths):
            break
        if pos < size:
            head.append(piece[pos:size])  # the rest starts block k
        offset = stop
    return tuple(hashes)


def _blocks_in(chars: int, width: int, fine_blocks: int, coarse_factor: int) -> int:
    """How many whole blocks the first ``chars`` units hold (``chain_chars``'s inverse)."""
    fine_end = width * fine_blocks
    if chars <= fine_end:
        return chars // width
    return fine_blocks + (chars - fine_end) // (width * coarse_factor)


WIDE_SEED = 0x9E37_79B9_7F4A_7C15
"""XOR-ed into the seed of a block with non-ASCII text (see the module docstring)."""


def block_hash(block: str, seed: int) -> BlockHash:
    """The hash of one block of the chain, seeded with the previous block's hash.

    Raises ``UnicodeEncodeError`` on a lone surrogate, which is no valid text.
    """
    if block.isascii():
        return xxhash.xxh3_64_intdigest(block.encode(), seed)
    return xxhash.xxh3_64_intdigest(block.encode("utf-16-le"), seed ^ WIDE_SEED)


def token_chain_hashes(
    tokens: Sequence[int],
    block_tokens: int,
    max_blocks: int,
    seed: int = 0,
    *,
    coarse_factor: int = 0,
    max_tokens: int = 1 << 20,
) -> tuple[BlockHash, ...]:
    """Chained xxh3-64 hashes of token ids, ``block_tokens`` ids per block (then coarse)."""
    end = min(len(tokens), max_tokens if coarse_factor else block_tokens * max_blocks)
    packed = token_bytes(tokens[:end])
    hashes: list[int] = []
    h = seed
    view = memoryview(packed)
    start = 0
    for width in block_widths(block_tokens, max_blocks, max(1, coarse_factor), end):
        h = xxhash.xxh3_64_intdigest(view[start : start + width * 8], h)
        hashes.append(h)
        start += width * 8
    return tuple(hashes)


def _text_between(pieces: Sequence[str], start: int, end: int) -> str:
    """Characters ``start:end`` of ``"".join(pieces)``, copying only those."""
    parts: list[str] = []
    offset = 0
    for piece in pieces:
        stop = offset + len(piece)
        if stop > start and offset < end:
            parts.append(piece[max(0, start - offset) : min(len(piece), end - offset)])
        if stop >= end:
            break
        offset = stop
    return "".join(parts)


def span_hashes(
    pieces: Sequence[str], start: int, lengths: Sequence[int], seed: int
) -> list[BlockHash]:
    """``block_hash`` of characters ``start:start + n`` of ``"".join(pieces)``, for each ``n``.

    The text is copied (and, if ASCII, encoded) once, up to the longest span; the
    hash of a span does not depend on how the prompt is split into pieces. Seeded
    with a chain's hash at ``start``, a span's hash stands for the text up to its end.
    """
    text = _text_between(pieces, start, start + max(lengths, default=0))
    if text.isascii():
        view = memoryview(text.encode())
        digest = xxhash.xxh3_64_intdigest
        return [digest(view[:n], seed) for n in lengths]
    return [block_hash(text[:n], seed) for n in lengths]
