"""Cutting at added tokens: the trie regex finds what the longest-first alternation finds."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.tokens.spans import longest_of

_WORDS = st.sets(st.text(alphabet="ab\n<>|", min_size=1, max_size=6), min_size=1, max_size=12)


@settings(max_examples=500, deadline=None)
@given(words=_WORDS, text=st.text(alphabet="ab\n<>|c", max_size=60))
def test_the_trie_matches_the_longest_word_leftmost_like_the_alternation(
    words: set[str], text: str
) -> None:
    alternation = re.compile("|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)))
    trie = re.compile(longest_of(words))
    assert [m.span() for m in trie.finditer(text)] == [m.span() for m in alternation.finditer(text)]


def test_newline_runs_cut_longest_first() -> None:
    runs = re.compile(longest_of(["\n" * k for k in range(1, 32)]))
    assert [m.group() for m in runs.finditer("a\n\nb" + "\n" * 40)] == ["\n\n", "\n" * 31, "\n" * 9]
