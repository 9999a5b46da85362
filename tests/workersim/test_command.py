"""``kvgate worker-sim`` on the command line."""

from __future__ import annotations

import re
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request

from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.testing import wait_until_sync


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
        "--slots",
        "--slot-save-path",
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


def _listening_url(process: subprocess.Popen[bytes], timeout: float = 20.0) -> str:
    """The URL in the "listening on" line the worker prints once it has bound its port."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([process.stdout], [], [], left)[0]:
            break
        line = process.stdout.readline()
        if not line:
            raise AssertionError("worker-sim exited before it was listening")
        if found := re.search(rb"listening on (http://\S+)", line):
            return found.group(1).decode()
    raise TimeoutError(f"worker-sim not listening after {timeout}s")


def test_serves_until_terminated() -> None:
    # Port 0, not a port found free beforehand: another socket could take that one
    # before the new process has bound it. The worker prints where it listens.
    command = [sys.executable, "-m", "kvgate.cli", "worker-sim", "--port", "0"]
    process = subprocess.Popen(
        [*command, "--profile", "fast"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,  # unbuffered, so select() sees every line readline() has not read
    )
    try:
        url = _listening_url(process)
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), url
        wait_until_sync(lambda: _healthy(url), timeout=20, message="worker-sim to start")
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    assert process.returncode == 0, err.decode()
