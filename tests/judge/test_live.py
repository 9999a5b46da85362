"""A scenario live: emulated workers, kvgate in front, a worker slowed on the replay's clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kvgate.bench.routers import ROUTERS
from kvgate.judge.live import fleet_spec, run_live
from kvgate.judge.scenarios import A100, H100, Scenario, Slowdown


def test_the_fleet_is_the_scenarios_profiles_in_turn() -> None:
    s = Scenario(name="x", workload="uniform", requests=1, why="", profiles=(H100, A100))
    spec = fleet_spec(s, 7)
    assert list(spec.profiles) == [H100, A100, H100, A100]
    assert (spec.seed, spec.block_size, spec.time_scale) == (7, 16, 10.0)


@pytest.mark.timeout(300)  # a fleet of worker processes and a gateway: slow on a busy machine
def test_a_live_run_slows_its_worker_and_counts_its_share(tmp_path: Path) -> None:
    scenario = Scenario(
        name="tiny",
        workload="uniform:rate=20,prompt_tokens=256,output_tokens=16",
        requests=60,
        why="a test",
        workers=2,
        concurrency=8,
        time_scale=1.0,
        slowdown=Slowdown(at_s=0.0, worker=0, speed=0.5, settle_s=0.5),
    )
    record = asyncio.run(
        run_live(
            scenario,
            3,
            ROUTERS["kvgate-round_robin"],
            venv=None,
            role="baseline",
            logs=tmp_path,
        )
    )
    assert record["mode"] == "live" and record["role"] == "baseline"
    assert record["finished"] == 60 and record["errors"] == 0
    assert sum(record["per_worker"]) == 60
    assert record["ttft_p99"] >= record["ttft_p50"] > 0
    # Round robin ignores speed: the slowed worker keeps about half of what came later.
    assert record["slowed_share"] == pytest.approx(0.5, abs=0.15)
