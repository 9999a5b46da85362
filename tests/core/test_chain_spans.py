"""Spans of a prompt's text hashed after a whole block (``core.chain.span_hashes``).

A chain end past the fine blocks is marked by the hash of the text after its last
whole block, seeded with that block (``core.policies.lives``): the hash must
stand for the text alone, however the prompt is split, and agree with the chain's
own hashing of a block.
"""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.core.chain import block_hash, span_hashes


def text(seed: int, size: int, alphabet: str = "abcdefghij klmnopqrstuvwxyz.") -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(size))


WHOLE = text(1, 12_000)


@settings(max_examples=60, deadline=None)
@given(
    cuts=st.lists(st.integers(0, len(WHOLE)), max_size=4),
    start=st.integers(0, 6_000),
    lengths=st.lists(st.integers(0, 6_000), min_size=1, max_size=5),
)
def test_a_span_hash_does_not_depend_on_how_the_prompt_is_split(
    cuts: list[int], start: int, lengths: list[int]
) -> None:
    bounds = [0, *sorted(cuts), len(WHOLE)]
    pieces = [WHOLE[a:b] for a, b in itertools.pairwise(bounds)]
    expected = [block_hash(WHOLE[start : start + n], 7) for n in lengths]
    assert span_hashes(pieces, start, lengths, 7) == expected
    assert span_hashes((WHOLE,), start, lengths, 7) == expected


def test_a_span_is_hashed_as_the_chain_hashes_a_block() -> None:
    """ASCII as its bytes, other text as UTF-16-LE under its own seed (``block_hash``)."""
    mixed = "a" * 300 + "漢字かな" * 50
    got = span_hashes(("x" * 100, mixed), 100, (256, 500), 3)
    assert got == [block_hash("a" * 256, 3), block_hash(mixed[:500], 3)]
    assert got[0] != got[1]


def test_the_seed_tells_the_same_text_after_other_blocks_apart() -> None:
    assert span_hashes((WHOLE,), 0, (512,), 1) != span_hashes((WHOLE,), 0, (512,), 2)
