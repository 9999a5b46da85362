"""``kvgate serve`` refuses bad configuration with a clear message, not a traceback."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from kvgate.cli import app


def test_unknown_key_in_config_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "kvgate.yaml"
    path.write_text("workers: [{url: 'http://w:1'}]\nretries: {cuont: 3}\n")
    result = CliRunner().invoke(app, ["serve", "--config", str(path)])
    assert result.exit_code == 2
    assert "retries.cuont: unknown key" in result.output
    assert "Traceback" not in result.output


def test_unknown_policy_is_refused_at_start_up() -> None:
    result = CliRunner().invoke(app, ["serve", "--worker", "http://w:1", "--policy", "nope"])
    assert result.exit_code == 2
    assert "unknown policy 'nope'" in result.output


def test_a_missing_environment_secret_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "kvgate.yaml"
    path.write_text("admin_token: '${KVGATE_TEST_UNSET_TOKEN}'\n")
    result = CliRunner().invoke(app, ["serve", "--config", str(path)], env={})
    assert result.exit_code == 2
    assert "admin_token: environment variable KVGATE_TEST_UNSET_TOKEN is not set" in result.output
    assert "Traceback" not in result.output


def test_version_is_printed() -> None:
    from kvgate import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"kvgate {__version__}"


def test_a_bad_log_level_is_refused() -> None:
    result = CliRunner().invoke(app, ["serve", "--log-level", "loud"])
    assert result.exit_code == 2
    assert "log_level" in result.output
