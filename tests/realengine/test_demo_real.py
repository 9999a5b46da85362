"""``kvgate demo --real-workers``: the flag picks the llama.cpp fleet and its short defaults.

These tests replace ``run_demo`` and start nothing; the fleet itself (start,
reset through the slot API, routing) runs for real in ``test_gateway.py``.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from kvgate.demo import command
from kvgate.demo.fleet import FleetFactory, emulated_fleet, llamacpp_fleet
from kvgate.demo.runner import DemoConfig
from kvgate.realengine import DEFAULT_MODEL_NAME


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """A root so ``demo`` stays a subcommand, as under ``kvgate``."""

    command.register(app)
    return app


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[tuple[DemoConfig, FleetFactory]]:
    """Replace ``run_demo`` with one that records its arguments and returns no policies."""
    calls: list[tuple[DemoConfig, FleetFactory]] = []

    async def fake_run_demo(
        config: DemoConfig, *, fleet_factory: FleetFactory, **_: object
    ) -> dict[str, Any]:
        calls.append((config, fleet_factory))
        fleet = config.fleet
        return {
            "config": {
                "fleet": {
                    "kind": fleet.kind,
                    "workers": fleet.workers,
                    "profile": fleet.profile,
                    "time_scale": fleet.time_scale,
                }
            },
            "workload": {"name": config.workload.split(":")[0]},
            "bound_hit_rate": 0.5,
            "policies": {},
        }

    monkeypatch.setattr(command, "run_demo", fake_run_demo)
    return calls


def test_help_documents_the_flag() -> None:
    result = CliRunner().invoke(_app(), ["demo", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--real-workers" in result.output
    assert "llama.cpp" in result.output


def test_real_workers_run_the_llamacpp_fleet_with_short_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("xllamacpp", reason="xllamacpp not installed")
    calls = _capture(monkeypatch)
    result = CliRunner().invoke(
        _app(), ["demo", "--real-workers", "--no-progress"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    [(config, factory)] = calls
    assert factory is llamacpp_fleet
    assert config.fleet.kind == "llama.cpp"
    assert config.fleet.model == DEFAULT_MODEL_NAME
    assert config.fleet.time_scale == 1.0
    assert config.fleet.workers == command.REAL_WORKERS
    assert tuple(config.policies) == command.REAL_POLICIES
    assert (config.requests, config.workload) == (command.REAL_REQUESTS, command.REAL_WORKLOAD)
    # The emulated demo's defaults would take many minutes on real CPU workers.
    assert config.requests < DemoConfig().requests
    assert "2 llama.cpp workers" in result.output


def test_options_override_the_real_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("xllamacpp", reason="xllamacpp not installed")
    calls = _capture(monkeypatch)
    args = ["demo", "--real-workers", "--no-progress", "--workers", "3", "--requests", "5"]
    result = CliRunner().invoke(_app(), [*args, "--policies", "default"])
    assert result.exit_code == 0, result.output
    [(config, _)] = calls
    assert (config.fleet.workers, config.requests, tuple(config.policies)) == (3, 5, ("default",))


def test_without_the_flag_the_fleet_stays_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _capture(monkeypatch)
    result = CliRunner().invoke(_app(), ["demo", "--no-progress"])
    assert result.exit_code == 0, result.output
    [(config, factory)] = calls
    assert factory is emulated_fleet
    assert config.fleet.kind == "emulated"
    assert config.requests == DemoConfig().requests


def test_real_workers_without_the_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _capture(monkeypatch)
    # A None entry makes ``import xllamacpp`` fail as if it were not installed.
    monkeypatch.setitem(sys.modules, "xllamacpp", None)
    result = CliRunner().invoke(_app(), ["demo", "--real-workers", "--no-progress"])
    assert result.exit_code == 2
    assert "pip install 'kvgate[llamacpp]'" in result.output
    assert calls == []
