"""The engine's tokenizer: deterministic ids, about 4 characters a token.

The fast path (memoised space-separated parts) must give exactly the ids of the
original definition, kept here as ``_reference_tokenize``.
"""

import random
import re

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.engine import tokenizer
from kvgate.engine.tokenizer import (
    LONGEST_CACHED,
    PART_CACHE_SIZE,
    PIECE_CHARS,
    VOCAB_SIZE,
    count_tokens,
    tokenize,
)
from kvgate.workload.prompts import segment_text

ENGLISH = (
    "The quick brown fox jumps over the lazy dog. Paged attention stores the key and "
    "value cache in fixed-size blocks, so that sequences sharing a prefix can share memory; "
    "continuous batching then schedules prefill and decode work in the same step."
)


def test_same_text_same_ids() -> None:
    assert tokenize(ENGLISH) == tokenize(ENGLISH)


def test_ids_are_in_the_vocabulary() -> None:
    assert all(0 <= t < VOCAB_SIZE for t in tokenize(ENGLISH))


def test_about_four_characters_a_token_on_english() -> None:
    chars_per_token = len(ENGLISH) / len(tokenize(ENGLISH))
    assert 3.0 <= chars_per_token <= 5.5


def test_long_words_are_split_into_pieces() -> None:
    word = "x" * (PIECE_CHARS * 3 + 1)
    assert len(tokenize(word)) == 4


def test_leading_space_changes_the_id() -> None:
    assert tokenize("a the")[1] != tokenize("the")[0]


def test_a_shared_prefix_gives_shared_leading_ids() -> None:
    a = tokenize(ENGLISH + " First question?")
    b = tokenize(ENGLISH + " Second question!")
    base = tokenize(ENGLISH)
    assert a[: len(base)] == b[: len(base)] == base
    assert a != b


def test_count_tokens_matches_tokenize() -> None:
    for text in (ENGLISH, "", "   ", "a,b;;c\n\nd", "supercalifragilistic"):
        assert count_tokens(text) == len(tokenize(text))


# -- the fast path against the original definition ------------------------------------

_REFERENCE_PIECES = re.compile(r"\w+|[^\w\s]+|\n")


def _reference_tokenize(text: str) -> list[int]:
    """The tokenizer as first written (one regex match at a time, nothing memoised)."""
    ids: list[int] = []
    append = ids.append
    digest = xxhash.xxh32_intdigest
    for match in _REFERENCE_PIECES.finditer(text):
        piece = match.group()
        lead = " " if match.start() and text[match.start() - 1].isspace() else ""
        if len(piece) <= 4:
            append(digest((lead + piece).encode(), 0x6B76_6761) % 128_256)
            continue
        append(digest((lead + piece[:4]).encode(), 0x6B76_6761) % 128_256)
        for start in range(4, len(piece), 4):
            append(digest(piece[start : start + 4].encode(), 0x6B76_6761) % 128_256)
    return ids


_ALPHABET = (
    "abcdefghijXYZ0189_ éüßЖж中文字🙂.,;:!?-'\"(){}[]<>/\\@#$%^&*+=|~`"
    " \n\t\r\x0b\x0c\x1c\x1f\x85\xa0\u2003\u2028\u3000"
)
"""Characters that exercise every rule: word and punctuation runs, newlines, spaces
(ASCII and Unicode, single and repeated), and non-ASCII letters."""


def _corpus() -> list[str]:
    rng = random.Random(20240607)
    texts = [
        "",
        " ",
        "  ",
        "\n",
        " \n \n\n  x",
        ENGLISH,
        " " + ENGLISH + "  ",
        ENGLISH.replace(" ", "\n"),
        ENGLISH.replace(" ", "  "),
        ENGLISH.replace(" ", "\t"),
        '{"model": "demo", "messages": [{"role": "user", "content": "hi\\n there"}]}',
        "def f(x):\n    return x ** 2  # square\n\n\tif x:\n\t\tpass\n",
        "x" * (LONGEST_CACHED - 1) + " " + "y" * LONGEST_CACHED + " " + "z" * (LONGEST_CACHED + 1),
        "a" * 10_000,
        "é" * 70 + " 中" * 70,
    ]
    texts += [segment_text(segment, rng.randrange(1, 9_000)) for segment in range(-20, 40)]
    for _ in range(200):
        size = rng.choice([1, 5, 40, 300, 8_192])
        words = [
            "".join(rng.choices(_ALPHABET, k=rng.randint(1, 90))) for _ in range(size // 8 + 1)
        ]
        texts.append(rng.choice([" ", "", "\n", "  "]).join(words)[:size])
    return texts


def test_tokenize_gives_the_original_ids_on_a_varied_corpus() -> None:
    for text in _corpus():
        expected = _reference_tokenize(text)
        assert tokenize(text) == expected, text[:200]
        assert tokenize(text) == expected  # again, now from the memo
        assert count_tokens(text) == len(expected)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_ALPHABET, max_size=400))
def test_tokenize_gives_the_original_ids_on_any_text(text: str) -> None:
    assert tokenize(text) == _reference_tokenize(text)
    assert count_tokens(text) == len(tokenize(text))


def test_the_part_memo_is_bounded() -> None:
    for memo in (tokenizer._first_part_ids, tokenizer._later_part_ids):
        assert memo.cache_info().maxsize == PART_CACHE_SIZE
    before = tokenizer._later_part_ids.cache_info().currsize
    tokenize(" " + "q" * (LONGEST_CACHED + 1) + " ")  # too long to memoise
    assert tokenizer._later_part_ids.cache_info().currsize <= before + 1  # only the "" part
