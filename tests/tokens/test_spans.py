"""Cutting at added tokens: the trie regex finds what the longest-first alternation finds;
grouped message by message, a next turn reuses the earlier messages with the same ids."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.tokens.encoders import hf_encoder
from kvgate.tokens.reference import facts
from kvgate.tokens.spans import Spans, longest_of

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


def test_a_next_turn_reuses_the_earlier_messages_and_keeps_the_ids() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import AddedToken, normalizers
    from tokenizers.models import BPE

    pieces = ["<unk>", "▁", *"abcdefghijklmnopqrstuvwxyz<>|_", "ab", "▁a"]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
    tokenizer = tokenizers.Tokenizer(
        BPE(vocab, [("a", "b"), ("▁", "a")], unk_token="<unk>", byte_fallback=True)
    )
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in ("\n", "\n\n")])
    chat = "<|im_start|>{}\n{}<|im_end|>\n"
    written = ["<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"]
    known = facts(tokenizer)
    spans = Spans(known.added, written, hf_encoder(tokenizer), plain=known.plain)
    assert spans._openers == ("<|im_start|>assistant",)
    first = chat.format("user", "a b\n\nab\n x") + "<|im_start|>assistant\n"
    turn = (
        first + "ok\n\nab<|im_end|>\n" + chat.format("user", "ba\nab") + "<|im_start|>assistant\n"
    )
    for text in (first, turn):
        assert spans.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids
    assert spans.hits >= 1  # the first message came from memory
