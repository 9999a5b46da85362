"""``kvgate engine llamacpp`` and its options, without starting llama.cpp."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.realengine import (
    LlamaCppOptions,
    LlamaCppUnavailableError,
    llamacpp_available,
    small_options,
    start_llamacpp,
)
from kvgate.realengine import command as command_module


def test_help_lists_the_documented_options() -> None:
    result = CliRunner().invoke(app, ["engine", "llamacpp", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in ("--model", "--port", "--threads", "--parallel", "--ctx", "--cache-ram-mib"):
        assert option in result.output


def test_options_survive_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[LlamaCppOptions] = []

    def fake_serve(options: LlamaCppOptions, **_: object) -> None:
        served.append(options)

    monkeypatch.setattr(command_module, "serve", fake_serve)
    options = LlamaCppOptions(
        model=Path("/models/x.gguf"),
        alias="x",
        host="0.0.0.0",
        port=9001,
        threads=3,
        parallel=6,
        ctx=24_576,
        metrics=False,
        cache_ram_mib=512,
        cache_reuse=256,
        kv_unified=True,
        slot_similarity=0.5,
        warmup=False,
        slot_save_path=Path("/tmp/slots"),
    )
    result = CliRunner().invoke(app, ["engine", "llamacpp", *options.to_args()])
    assert result.exit_code == 0, result.output
    assert served == [options]


@pytest.mark.parametrize(
    "args",
    [
        ["--threads", "0"],
        ["--parallel", "0"],
        ["--ctx", "100", "--parallel", "4"],
        ["--port", "-1"],
    ],
)
def test_invalid_options_are_refused(args: list[str]) -> None:
    result = CliRunner().invoke(app, ["engine", "llamacpp", *args])
    assert result.exit_code != 0
    assert "Invalid value" in result.output


def test_missing_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes ``import xllamacpp`` fail as if it were not installed.
    monkeypatch.setitem(sys.modules, "xllamacpp", None)
    assert not llamacpp_available()
    with pytest.raises(LlamaCppUnavailableError, match=r"kvgate\[llamacpp\]"):
        start_llamacpp(small_options())
    result = CliRunner().invoke(app, ["engine", "llamacpp", "--port", "0"])
    assert result.exit_code == 2
    assert "pip install 'kvgate[llamacpp]'" in result.output


def test_small_options_take_overrides() -> None:
    options = small_options(threads=2, parallel=4)
    assert (options.port, options.threads, options.parallel) == (0, 2, 4)
    assert options.ctx // options.parallel >= 2_048
