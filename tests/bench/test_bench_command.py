"""``kvgate bench`` through its command line, against a worker on a background loop."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from kvgate.bench import command
from kvgate.testing import free_port
from kvgate.workersim import WorkerOptions, start_worker


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """A root so ``bench`` stays a subcommand, as under ``kvgate``."""

    command.register(app)
    return app


@contextlib.contextmanager
def threaded_worker(**options: Any) -> Iterator[str]:
    """An emulated worker served from its own thread's event loop (the CLI runs its own)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    opts = WorkerOptions(port=0, profile="fast", kv_blocks=4096, seed=5, **options)
    handle = asyncio.run_coroutine_threadsafe(start_worker(opts), loop).result(timeout=10)
    try:
        yield handle.url
    finally:
        asyncio.run_coroutine_threadsafe(handle.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


CHAT = "chat:system_tokens=200,user_tokens=30,output_tokens=8,think_s=0.05"
"""A chat workload small enough to run quickly against one emulated worker."""

SIXTEEN_CHATS = ("--workload", CHAT, "--requests", "16", "--rate-scale", "20")


@pytest.fixture
def worker_url() -> Iterator[str]:
    """A healthy emulated worker."""
    with threaded_worker() as url:
        yield url


def test_bench_writes_results_json_and_prints_the_table(worker_url: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        "bench",
        "--target", worker_url,
        *SIXTEEN_CHATS,
        "--concurrency", "4",
        "--seed", "2",
        "--label", "w0",
        "--out", str(out),
        "--no-progress",
    ]  # fmt: skip
    result = CliRunner().invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    assert "w0" in result.output
    assert "infinite-cache bound" in result.output
    data = json.loads((out / "results.json").read_text())
    run = data["policies"]["w0"]
    assert run["finished"] == run["requests"] == 16
    for key in ("hit_rate", "ttft_p50", "ttft_p99", "throughput"):
        assert key in run
    assert "bound_hit_rate" in data
    assert data["workload"]["rate_scale"] == 20.0
    assert data["config"]["concurrency"] == 4


def test_bench_needs_a_workload_or_a_trace(worker_url: str) -> None:
    result = CliRunner().invoke(make_app(), ["bench", "--target", worker_url, "--no-progress"])
    assert result.exit_code != 0
    assert "exactly one" in result.output


def test_bench_reports_an_unreachable_target() -> None:
    target = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(
        make_app(),
        ["bench", "--target", target, "--workload", "chat", "--requests", "2", "--no-progress"],
    )
    assert result.exit_code == 1
    assert "kvgate bench:" in result.output


def test_bench_fails_and_says_why_when_every_request_failed() -> None:
    with threaded_worker(error_rate=1.0) as url:
        args = ["bench", "--target", url, "--workload", CHAT, "--requests", "6"]
        result = CliRunner().invoke(make_app(), [*args, "--rate-scale", "50", "--no-progress"])
    assert result.exit_code == 1, result.output
    assert "every request failed (6 sent): http_500 x6" in result.output


def test_bench_prints_csv_and_json_on_stdout(worker_url: str) -> None:
    base = ["bench", "--target", worker_url, "--workload", CHAT, "--requests", "8"]
    base += ["--rate-scale", "50", "--label", "w0"]  # progress bars go to stderr
    as_csv = CliRunner().invoke(make_app(), [*base, "--format", "csv"])
    assert as_csv.exit_code == 0, as_csv.output
    (row,) = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert row["policy"] == "w0" and int(row["finished"]) == 8
    assert 0.0 <= float(row["hit_rate"]) <= 1.0 and float(row["ttft_p50"]) > 0
    as_json = CliRunner().invoke(make_app(), [*base, "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["policies"]["w0"]["finished"] == 8 and "bound_hit_rate" in data


def test_bench_misses_prints_where_the_misses_went(worker_url: str) -> None:
    args = [
        "bench",
        "--target", worker_url,
        *SIXTEEN_CHATS,
        "--seed", "2",
        "--misses",
        "--no-progress",
    ]  # fmt: skip
    result = CliRunner().invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    assert "misses by cause" in result.output
    assert "moved counts all a" in " ".join(result.output.split())  # the caption wraps
    plain = CliRunner().invoke(make_app(), [a for a in args if a != "--misses"])
    assert "misses by cause" not in plain.output
