"""``kvgate demo`` on a tiny configuration: every policy through the real gateway."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from kvgate.bench import run_bench
from kvgate.demo import command
from kvgate.demo.fleet import EmulatedFleet, Fleet, FleetSpec, emulated_fleet
from kvgate.demo.runner import DemoConfig, run_demo
from kvgate.demo.table import demo_csv, demo_table
from kvgate.workload.synthetic import build_workload

TINY_WORKLOAD = (
    "chat:rate=60,think_s=0.05,turns_mean=4,system_tokens=200,user_tokens=40,output_tokens=8"
)
TINY_FLEET = FleetSpec(workers=2, profile="fast", time_scale=1.0, kv_blocks=512)


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """A root so ``demo`` stays a subcommand, as under ``kvgate``."""

    command.register(app)
    return app


async def test_tiny_demo_answers_every_request_for_every_policy() -> None:
    resets = 0

    @contextlib.asynccontextmanager
    async def counting_fleet(spec: FleetSpec) -> AsyncIterator[Fleet]:
        # The seam a real-worker fleet will use: any factory yielding URLs and a reset.
        async with emulated_fleet(spec) as fleet:

            class Counting:
                urls = fleet.urls

                async def reset(self) -> None:
                    nonlocal resets
                    resets += 1
                    await fleet.reset()

            yield Counting()

    config = DemoConfig(
        fleet=TINY_FLEET,
        policies=("round_robin", "session_affinity"),
        workload=TINY_WORKLOAD,
        requests=24,
        health_interval_s=0.1,
    )
    results = await run_demo(config, fleet_factory=counting_fleet)

    assert resets == 2  # each policy starts on a cold fleet
    assert list(results["policies"]) == ["round_robin", "session_affinity"]
    workers = results["config"]["fleet"]["worker_urls"]
    for summary in results["policies"].values():
        assert summary["finished"] == summary["requests"] == 24
        assert summary["errors"] == 0 and summary["shed"] == 0
        # Every answer came through the gateway, which names the worker it chose.
        assert list(summary["served"]) == workers
        assert sum(summary["served"].values()) == 24
        assert summary["hit_rate"] > 0
    console = Console(record=True, width=200)
    console.print(demo_table(results))
    text = console.export_text()
    assert "round_robin" in text and "session_affinity" in text
    assert "time scale 1" in text
    # Emulated workers report their engines' own TTFT, shown beside the client's.
    assert "engine p50" in text and "model-time TTFT" in text
    # The default table fits 80 columns; --wide adds the rest; CSV has every column.
    narrow = Console(record=True, width=80)
    narrow.print(demo_table(results))
    narrow_text = narrow.export_text()
    assert max(len(line) for line in narrow_text.splitlines()) <= 80
    assert "…" not in narrow_text  # nothing cut to make it fit
    assert "served" not in narrow_text
    wide = Console(record=True, width=200)
    wide.print(demo_table(results, wide=True))
    wide_text = wide.export_text()
    assert "served" in wide_text and "engine p99" in wide_text
    rows = list(csv.DictReader(io.StringIO(demo_csv(results))))
    assert [r["policy"] for r in rows] == ["round_robin", "session_affinity"]
    assert float(rows[0]["hit_rate"]) == results["policies"]["round_robin"]["hit_rate"]
    for summary in results["policies"].values():
        assert 0 < summary["worker_ttft_p50"] <= summary["worker_ttft_p99"]


async def test_reset_leaves_no_cached_blocks() -> None:
    async with emulated_fleet(FleetSpec(workers=1, profile="fast", kv_blocks=512)) as fleet:
        assert isinstance(fleet, EmulatedFleet)
        await run_bench(fleet.urls[0], build_workload(TINY_WORKLOAD), requests=6, model="demo")
        engine = fleet.handles[0].engine
        await fleet.reset()
        assert engine.reset_prefix_cache() == 0  # nothing left to forget


def test_demo_command_prints_the_table_and_writes_results(tmp_path: Path) -> None:
    args = [
        "demo",
        "--workers", "2",
        "--policies", "least_request,default",
        "--requests", "16",
        "--profile", "fast",
        "--time-scale", "1",
        "--kv-blocks", "512",
        "--workload", TINY_WORKLOAD,
        "--out", str(tmp_path),
        "--no-progress",
    ]  # fmt: skip
    result = CliRunner().invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    assert "least_request" in result.output and "default" in result.output
    assert "engine p50" in result.output and "time scale 1" in result.output
    data = json.loads((tmp_path / "results.json").read_text())
    for summary in data["policies"].values():
        assert summary["finished"] == summary["requests"] == 16
    assert data["bound_hit_rate"] > 0


def test_demo_command_refuses_an_unknown_policy() -> None:
    result = CliRunner().invoke(make_app(), ["demo", "--policies", "nope", "--no-progress"])
    assert result.exit_code != 0
    assert "nope" in result.output


@pytest.fixture
def kvgate_level() -> Iterator[logging.Logger]:
    """The 'kvgate' logger at WARNING for the test, its own level put back after."""
    logger = logging.getLogger("kvgate")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield logger
    logger.setLevel(level)


def test_the_demo_quiets_the_kvgate_logger_only_while_its_fleet_runs(
    kvgate_level: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In-process (as in a test suite), a demo that left the logger at ERROR silenced every
    # later test's warnings: refused arguments, a failed run and a finished one put it back.
    refused = CliRunner().invoke(make_app(), ["demo", "--policies", "nope", "--no-progress"])
    assert refused.exit_code != 0
    assert kvgate_level.level == logging.WARNING
    levels: list[int] = []

    async def failing(config: DemoConfig, **_: object) -> dict[str, object]:
        levels.append(kvgate_level.level)
        raise RuntimeError("the fleet did not start")

    monkeypatch.setattr(command, "run_demo", failing)
    failed = CliRunner().invoke(make_app(), ["demo", "--no-progress"])
    assert isinstance(failed.exception, RuntimeError)
    assert levels == [logging.ERROR]  # quiet while it ran
    assert kvgate_level.level == logging.WARNING

    async def finished(config: DemoConfig, **_: object) -> dict[str, object]:
        levels.append(kvgate_level.level)
        return {"policies": {}}

    monkeypatch.setattr(command, "run_demo", finished)
    done = CliRunner().invoke(make_app(), ["demo", "--progress", "--format", "json"])
    assert done.exit_code == 0, done.output
    assert levels[-1] == logging.ERROR and kvgate_level.level == logging.WARNING
    CliRunner().invoke(make_app(), ["demo", "--no-progress", "--verbose", "--format", "json"])
    assert levels[-1] == logging.WARNING  # --verbose leaves it alone
