"""``kvgate bench`` through its command line, against a worker on a background loop."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture
def worker_url() -> Iterator[str]:
    """An emulated worker served from its own thread's event loop (the CLI runs its own)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    options = WorkerOptions(port=0, profile="fast", kv_blocks=4096, seed=5)
    handle = asyncio.run_coroutine_threadsafe(start_worker(options), loop).result(timeout=10)
    try:
        yield handle.url
    finally:
        asyncio.run_coroutine_threadsafe(handle.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_bench_writes_results_json_and_prints_the_table(worker_url: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        "bench",
        "--target", worker_url,
        "--workload", "chat:system_tokens=200,user_tokens=30,output_tokens=8,think_s=0.05",
        "--requests", "16",
        "--rate-scale", "20",
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
