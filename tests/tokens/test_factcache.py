"""The reference's facts kept by the ``tokenizer.json``'s digest: a restart skips the
child; a corrupt, hostile or stale file is a miss and the child runs as before."""

from __future__ import annotations

import json
import logging
import subprocess
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from kvgate.tokens import encoders, factcache, reference
from kvgate.tokens.encoders import encoder
from kvgate.tokens.factcache import FactCache, cache_folder
from kvgate.tokens.reference import PROBE, Reference

from .tiny import tiny_tokenizer

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("fastokens")


@pytest.fixture(autouse=True)
def only_fastokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidate the shared environment has (gigatoken would be tried first)."""
    monkeypatch.setattr(encoders, "CANDIDATES", {"fastokens": encoders._fastokens})


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The commands of the children started (the reference's)."""
    started: list[list[str]] = []
    popen = subprocess.Popen

    def recorded(command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(command)
        return popen(command, **kwargs)

    monkeypatch.setattr(reference.subprocess, "Popen", recorded)
    return started


def test_kept_facts_skip_the_child(tmp_path: Path, children: list[list[str]]) -> None:
    file = tiny_tokenizer(tmp_path / "model")
    cache = FactCache(tmp_path / "cache")
    encode, library, known = encoder(file, cache=cache)
    assert library == "fastokens" and len(children) == 1
    assert [p.name for p in cache.folder.iterdir()] == [f"{cache.key(file)}.json"]
    again, library, kept = encoder(file, cache=cache)
    assert library == "fastokens" and kept == known
    assert len(children) == 1  # no second child
    assert again("ab abc\n a") == encode("ab abc\n a")


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe",
        b"[]",
        b'{"key": "KEY"}',
        b'{"key": "another", "facts": FACTS}',
        b'{"key": "KEY", "facts": {"added": {}, "plain": true, "probe": [], "special": []}}',
        b'{"key": "KEY", "facts": {"added": {"a": -1}, "plain": true, "probe": [], "special": []}}',
        b'{"key": "KEY", "facts": {"added": {"a": true}, "plain": 1, "probe": [], "special": []}}',
        b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_a_corrupt_file_is_a_miss_and_is_replaced(
    tmp_path: Path, children: list[list[str]], content: bytes
) -> None:
    file = tiny_tokenizer(tmp_path / "model")
    cache = FactCache(tmp_path / "cache")
    key = cache.key(file)
    truth = encoder(file, cache=cache)[2]
    facts = json.dumps(asdict(truth)).encode()
    kept = cache.folder / f"{key}.json"
    kept.write_bytes(content.replace(b"KEY", key.encode()).replace(b"FACTS", facts))
    assert cache.get(key) is None
    assert encoder(file, cache=cache)[1:] == ("fastokens", truth)
    assert len(children) == 2  # the child ran again
    assert cache.get(key) == truth  # and its answer replaced the file


def test_links_and_oversized_files_are_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tiny_tokenizer(tmp_path / "model")
    cache = FactCache(tmp_path / "cache")
    key = cache.key(file)
    truth = encoder(file, cache=cache)[2]
    kept = cache.folder / f"{key}.json"
    elsewhere = tmp_path / "elsewhere.json"
    kept.rename(elsewhere)
    kept.symlink_to(elsewhere)
    assert cache.get(key) is None
    kept.unlink()
    elsewhere.rename(kept)
    assert cache.get(key) == truth
    monkeypatch.setattr(factcache, "MAX_BYTES", 100)
    assert cache.get(key) is None


def test_another_file_or_probe_misses(
    tmp_path: Path, children: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = FactCache(tmp_path / "cache")
    first = tiny_tokenizer(tmp_path / "one")
    other = tiny_tokenizer(tmp_path / "two", extra="<cb>")
    encoder(first, cache=cache)
    assert cache.key(other) != cache.key(first) and cache.get(cache.key(other)) is None
    _, _, known = encoder(other, cache=cache)
    assert len(children) == 2 and "<cb>" in known.added
    before = cache.key(first)
    assert cache.key(tiny_tokenizer(tmp_path / "three")) == before  # the same bytes
    monkeypatch.setattr(factcache, "PROBE", (*PROBE[:-1], "a changed probe"))
    assert cache.key(first) != before  # what the child computes changed


def test_kept_facts_that_are_wrong_are_checked_and_corrected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    file = tiny_tokenizer(tmp_path / "model")
    cache = FactCache(tmp_path / "cache")
    key = cache.key(file)
    truth = encoder(file, cache=cache)[2]
    wrong = replace(truth, probe=((1, 2, 3), *truth.probe[1:]))
    cache.put(key, wrong)
    with caplog.at_level(logging.WARNING, logger="kvgate.tokens.encoders"):
        assert encoder(file, cache=cache)[1:] == ("fastokens", truth)  # judged by the child's
    assert "kept facts" in caplog.text
    assert cache.get(key) == truth  # the next start uses them
    assert encoder(file, cache=cache)[1] == "fastokens"


def test_an_unwritable_folder_is_no_cache(
    tmp_path: Path, children: list[list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    file = tiny_tokenizer(tmp_path / "model")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    cache = FactCache(blocked / "cache")
    with caplog.at_level(logging.WARNING, logger="kvgate.tokens.factcache"):
        assert encoder(file, cache=cache)[1] == "fastokens"
        assert encoder(file, cache=cache)[1] == "fastokens"
    assert len(children) == 2 and "cannot keep" in caplog.text


def test_the_cache_folder_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_folder("auto") == tmp_path / "kvgate" / "tokenizers"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder("auto") == tmp_path / "home" / ".cache" / "kvgate" / "tokenizers"
    assert cache_folder("off") is None
    assert cache_folder(str(tmp_path / "kept")) == tmp_path / "kept"


def test_the_facts_parse_only_from_their_own_form() -> None:
    good = {"added": {"<x>": 7}, "plain": True, "probe": [[1]] * len(PROBE), "special": [2, 1]}
    assert Reference.parse(good).added == {"<x>": 7}
    for bad in (
        {**good, "extra": 1},
        {**good, "added": {"<x>": 1.5}},
        {**good, "added": [["<x>", 7]]},
        {**good, "plain": "yes"},
        {**good, "probe": [[1]]},
        {**good, "probe": [[1 << 40]] * len(PROBE)},
        {**good, "special": "2"},
        None,
    ):
        with pytest.raises(ValueError):
            Reference.parse(bad)


def test_a_folder_others_can_write_is_no_cache(
    tmp_path: Path, children: list[list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """``reference_cache: /tmp/...`` or an ``XDG_CACHE_HOME`` shared with other users: a
    folder that exists already keeps its mode (``mkdir`` makes only a new one 0700), and
    a file another user wrote there could name any added tokens: not read, not written."""
    file = tiny_tokenizer(tmp_path / "model")
    cache = FactCache(tmp_path / "cache")
    key = cache.key(file)
    truth = encoder(file, cache=cache)[2]
    cache.folder.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="kvgate.tokens.factcache"):
        assert cache.get(key) is None
        (cache.folder / f"{key}.json").unlink()
        assert encoder(file, cache=cache)[1:] == ("fastokens", truth)
    assert len(children) == 2 and "cannot keep" in caplog.text
    assert not (cache.folder / f"{key}.json").exists()
    cache.folder.chmod(0o700)
    cache.put(key, truth)
    (cache.folder / f"{key}.json").chmod(0o666)
    assert cache.get(key) is None


def test_wrong_kept_facts_do_not_fail_a_library_asked_for_by_name(tmp_path: Path) -> None:
    """A well-formed kept file with a wrong probe (stale, or forged) made ``library:
    fastokens`` fail every start (EncoderLoadError, the file never replaced) and ``auto``
    start on ``tokenizers``: the child's facts judge instead, and replace the file."""
    file = tiny_tokenizer(tmp_path / "model")
    cache = FactCache(tmp_path / "cache")
    key = cache.key(file)
    truth = encoder(file, cache=cache)[2]
    wrong = replace(truth, probe=((1, 2, 3), *truth.probe[1:]))
    for library in ("fastokens", "auto"):
        cache.put(key, wrong)
        assert encoder(file, library, cache)[1:] == ("fastokens", truth)  # type: ignore[arg-type]
        assert cache.get(key) == truth


def test_no_home_folder_is_no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container's user without a passwd entry nor HOME: ``Path.home()`` raises, and the
    default ``auto`` failed the tokenizer's load; now it only keeps nothing."""
    import pwd

    def unknown(uid: int) -> Any:
        raise KeyError(uid)

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", unknown)
    assert cache_folder("auto") is None


@pytest.mark.parametrize("relative", ["cache", "./cache", "~/cache"])
def test_a_relative_xdg_cache_home_is_ignored(
    relative: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The XDG spec: a relative path in ``XDG_CACHE_HOME`` is invalid and must be ignored.
    It was taken from the working directory (a gateway started in a shared folder kept its
    facts there); now the default, ``~/.cache``, is used."""
    monkeypatch.setenv("XDG_CACHE_HOME", relative)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert cache_folder("auto") == tmp_path / "home" / ".cache" / "kvgate" / "tokenizers"


def test_a_relative_home_is_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative ``HOME`` made ``~/.cache`` the working directory's."""
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "home")
    assert cache_folder("auto") is None
