"""A faster library tokenizes as ``tokenizers`` does, or is not used: the choice among
``CANDIDATES``, on fastokens (the one the shared environment has). Each candidate's ids
on Gemma's vocabulary are ``test_exactness``'s."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from kvgate.tokens import encoders, reference
from kvgate.tokens.encoders import EncoderLoadError, encoder, hf_encoder
from kvgate.tokens.reference import facts

from .tiny import tiny_tokenizer

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("fastokens")

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def only_fastokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are fastokens' (gigatoken, if installed, would be tried first)."""
    monkeypatch.setattr(encoders, "CANDIDATES", {"fastokens": encoders._fastokens})


def test_fastokens_is_used_where_it_agrees_and_falls_back_where_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    file = tiny_tokenizer(tmp_path)
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
    file = tiny_tokenizer(tmp_path)
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

    file = tiny_tokenizer(tmp_path)
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
    file = tiny_tokenizer(tmp_path)
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


def test_auto_takes_the_first_candidate_that_loads_and_agrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    file = tiny_tokenizer(tmp_path)
    known = facts(tokenizers.Tokenizer.from_file(str(file)))
    real = encoders._fastokens

    def broken(file: Path) -> encoders.Encode:
        raise ValueError("unsupported")

    def wrong(file: Path) -> encoders.Encode:
        encode = real(file)
        return lambda text: [*encode(text), 0]

    candidates = {"broken": broken, "wrong": wrong, "fastokens": real}
    monkeypatch.setattr(encoders, "CANDIDATES", candidates)
    monkeypatch.setattr(encoders, "installed_library", lambda name: name != "absent")
    with caplog.at_level(logging.WARNING, logger="kvgate.tokens.encoders"):
        assert encoder(file)[1:] == ("fastokens", known)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        f"broken cannot load {file}",
        "wrong disagrees with tokenizers on 'Hello, world! The quick brown fox jumps over the "
        "lazy dog.'; tokenizing with fastokens",
    ]
    del candidates["fastokens"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvgate.tokens.encoders"):
        assert encoder(file)[1:] == ("tokenizers", known)
    assert (
        len(caplog.records) == 1 and "broken cannot" in caplog.text and "wrong dis" in caplog.text
    )
    with pytest.raises(EncoderLoadError, match="disagrees"):
        encoder(file, "wrong")  # type: ignore[arg-type]
    with pytest.raises(EncoderLoadError, match="'absent' is not installed"):
        encoder(file, "absent")  # type: ignore[arg-type]
