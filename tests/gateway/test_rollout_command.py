"""``kvgate rollout`` against a live gateway, and the quality evaluator's entry point."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from typing import Any

from typer.testing import CliRunner, Result

from kvgate.cli import app
from kvgate.gateway.control.config import EvaluatorConfig
from kvgate.gateway.control.evaluator import QualityEvaluator
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.testing import running_gateway
from kvgate.testing import wait_until

from .rollout_fleet import TOKEN, versioned_fleet


async def _kvgate(*args: str) -> Result:
    # The CLI runs its own event loop: keep it off this one.
    return await asyncio.to_thread(CliRunner().invoke, app, list(args))


async def test_rollout_commands_start_show_and_steer_a_rollout() -> None:
    async with versioned_fleet() as fleet, running_gateway(fleet.config()) as gw:
        base = ["--gateway", gw.url, "--token", TOKEN]
        started = await _kvgate(
            "rollout", "start", *base, "--model", "demo", "--baseline", "v1",
            "--canary", "v2", "--steps", "20,50,100", "--min-step-s", "60",
            "--p99-factor", "2", "--max-error-rate", "0.02",
        )  # fmt: skip
        assert started.exit_code == 0, started.output
        assert "progressing" in started.output

        shown = await _kvgate("rollout", "status", *base, "demo/v2", "--json")
        status = json.loads(shown.output)
        assert status["steps"] == [20.0, 50.0, 100.0]
        assert status["weights"] == {"v1": 80.0, "v2": 20.0}

        async def judged() -> bool:
            table = await _kvgate("rollout", "status", *base)
            return "latency_p99_vs_baseline" in table.output and "step_requests" in table.output

        await wait_until(judged, message="status table with gates")

        stepped = await _kvgate("rollout", "promote", "demo/v2", *base, "--step")
        assert stepped.exit_code == 0, stepped.output
        assert "v2 50%" in stepped.output
        paused = await _kvgate("rollout", "pause", "demo/v2", *base)
        assert "paused" in paused.output
        again = await _kvgate("rollout", "pause", "demo/v2", *base)
        assert again.exit_code == 1
        assert "HTTP 409" in again.output
        aborted = await _kvgate("rollout", "abort", "demo/v2", *base)
        assert "aborted" in aborted.output
        denied = await _kvgate("rollout", "status", "--gateway", gw.url, "--token", "nope")
        assert denied.exit_code == 1
        assert "HTTP 401" in denied.output


async def test_an_entry_point_evaluator_scores_samples(monkeypatch: Any) -> None:
    module = types.ModuleType("kvgate_test_judge")
    seen: list[dict[str, Any]] = []

    def judge(sample: dict[str, Any]) -> float:
        seen.append(sample)
        return 0.25 if "bad" in sample["response_text"] else 1.0

    module.judge = judge  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kvgate_test_judge", module)
    scores: list[tuple[str, str, float]] = []
    config = EvaluatorConfig(entry_point="kvgate_test_judge:judge", max_pending=1)
    evaluator = QualityEvaluator(config, lambda *s: scores.append(s), GatewayMetrics().rollout)
    request = json.dumps({"messages": [{"role": "user", "content": "hello"}]}).encode()
    response = json.dumps({"choices": [{"message": {"content": "a bad answer"}}]}).encode()
    assert evaluator.submit("demo", "v2", request, response)
    assert not evaluator.submit("demo", "v2", request, response)  # the queue holds one
    evaluator.start()
    try:
        await wait_until(lambda: bool(scores), message="a score")
    finally:
        await evaluator.stop()
    assert scores == [("demo", "v2", 0.25)]
    assert seen[0]["request_text"] == "hello"
