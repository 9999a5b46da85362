"""``kvgate worker-sim`` on the command line."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request

from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.testing import free_port, wait_until_sync


def test_help_lists_the_documented_options() -> None:
    result = CliRunner().invoke(app, ["worker-sim", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in (
        "--port",
        "--host",
        "--model",
        "--version",
        "--profile",
        "--kv-blocks",
        "--block-size",
        "--time-scale",
        "--error-rate",
        "--extra-latency-ms",
        "--seed",
        "--max-num-seqs",
        "--cpu-offload-blocks",
    ):
        assert option in result.output


def test_invalid_options_are_refused() -> None:
    runner = CliRunner()
    for args in (["--error-rate", "2"], ["--profile", "no-such-gpu"], ["--time-scale", "0"]):
        result = runner.invoke(app, ["worker-sim", "--port", "0", *args])
        assert result.exit_code != 0, args


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


def test_serves_until_terminated() -> None:
    port = free_port()
    command = [sys.executable, "-m", "kvgate.cli", "worker-sim", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--profile", "fast"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_sync(lambda: _healthy(url), timeout=20, message="worker-sim to start")
    finally:
        process.terminate()
        out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err.decode()
    assert f"listening on {url}".encode() in out
