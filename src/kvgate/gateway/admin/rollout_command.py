"""``kvgate rollout``: start, watch and steer canary rollouts through a gateway's admin API.

    kvgate rollout start  --gateway URL --model M --baseline V1 --canary V2 [--steps 5,25,100]
    kvgate rollout status --gateway URL [ID]
    kvgate rollout pause|resume|promote|abort ID --gateway URL

``--token`` (or ``KVGATE_ADMIN_TOKEN``) is the gateway's ``admin_token``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import aiohttp
import typer
import yaml
from rich.console import Console
from rich.table import Table

rollout_app = typer.Typer(
    name="rollout",
    help="Start, watch and steer canary rollouts through a gateway's admin API.",
    no_args_is_help=True,
)

Gateway = Annotated[str, typer.Option("--gateway", "-g", help="The gateway's base URL.")]
Token = Annotated[
    str | None,
    typer.Option(envvar="KVGATE_ADMIN_TOKEN", help="The gateway's admin token."),
]


class AdminCallError(Exception):
    """The admin API answered with an error (its message) or could not be reached."""


def register(app: typer.Typer) -> None:
    """Add the ``rollout`` command group to the ``kvgate`` CLI."""
    app.add_typer(rollout_app)


def call(
    gateway: str, method: str, path: str, token: str | None, body: object = None
) -> dict[str, Any]:
    """One admin API call; the decoded JSON answer, or ``AdminCallError``."""

    async def go() -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        timeout = aiohttp.ClientTimeout(total=30)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, gateway.rstrip("/") + path, json=body, headers=headers) as r,
        ):
            try:
                data = await r.json(content_type=None)
            except ValueError:
                data = None
            if r.status >= 400:
                err = data.get("error", {}) if isinstance(data, dict) else {}
                message = err.get("message") if isinstance(err, dict) else None
                raise AdminCallError(f"HTTP {r.status}: {message or r.reason}")
            return data if isinstance(data, dict) else {}

    try:
        return asyncio.run(go())
    except aiohttp.ClientError as exc:
        raise AdminCallError(f"cannot reach {gateway}: {exc}") from None


def _run(gateway: str, method: str, path: str, token: str | None, body: object = None) -> Any:
    try:
        return call(gateway, method, path, token, body)
    except AdminCallError as exc:
        typer.echo(f"kvgate rollout: {exc}", err=True)
        raise typer.Exit(1) from None


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_status(status: dict[str, Any], console: Console) -> None:
    """One rollout as a header line, its weights, and a table of its gates."""
    steps = status.get("steps") or []
    console.print(
        f"[bold]{status.get('rollout')}[/bold]  {status.get('baseline')} -> "
        f"{status.get('canary')}  state [bold]{status.get('state')}[/bold]"
        + (f" ({status['pause_reason']})" if status.get("pause_reason") else "")
        + f"  step {status.get('step')}/{len(steps)}  steps {steps}"
    )
    weights = status.get("weights") or {}
    console.print("weights: " + ", ".join(f"{v} {_fmt(w)}%" for v, w in weights.items()))
    elapsed = status.get("step_elapsed_s")
    console.print(
        f"step time {_fmt(elapsed)}s of {_fmt(status.get('min_step_duration_s'))}s, "
        f"requests {status.get('step_requests')} of {status.get('min_requests_per_step')}"
    )
    table = Table("gate", "observed", "bound", "samples", "verdict")
    for gate in status.get("gates") or []:
        verdict = str(gate.get("verdict"))
        style = {"pass": "green", "fail": "red"}.get(verdict, "yellow")
        table.add_row(
            str(gate.get("name")),
            _fmt(gate.get("observed")),
            _fmt(gate.get("bound")),
            _fmt(gate.get("samples")),
            f"[{style}]{verdict}[/{style}]",
        )
    console.print(table)
    if status.get("message"):
        console.print(f"message: {status['message']}")


@rollout_app.command()
def start(
    *,
    gateway: Gateway,
    model: Annotated[str | None, typer.Option(help="The model (the name clients send).")] = None,
    baseline: Annotated[str | None, typer.Option(help="The version now serving.")] = None,
    canary: Annotated[str | None, typer.Option(help="The version to roll out.")] = None,
    spec: Annotated[
        Path | None, typer.Option(help="A YAML/JSON rollout spec; options override it.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Rollout id (default model/canary).")] = None,
    steps: Annotated[str | None, typer.Option(help="Canary weights, e.g. 5,10,25,50,100.")] = None,
    min_step_s: Annotated[float | None, typer.Option(help="Minimum time per step.")] = None,
    min_requests: Annotated[int | None, typer.Option(help="Canary requests per step.")] = None,
    window_s: Annotated[float | None, typer.Option(help="Analysis window, seconds.")] = None,
    interval_s: Annotated[float | None, typer.Option(help="Seconds between analyses.")] = None,
    max_error_rate: Annotated[float | None, typer.Option(help="Canary error rate bound.")] = None,
    p99_factor: Annotated[
        float | None, typer.Option(help="Canary P99 latency ≤ this × the baseline's.")
    ] = None,
    p99_max_s: Annotated[float | None, typer.Option(help="Canary P99 latency bound, s.")] = None,
    ttft_p99_factor: Annotated[
        float | None, typer.Option(help="Canary P99 TTFT ≤ this × the baseline's.")
    ] = None,
    ttft_p99_max_s: Annotated[float | None, typer.Option(help="Canary P99 TTFT bound, s.")] = None,
    quality_min: Annotated[
        float | None, typer.Option(help="Floor of the canary's mean quality score.")
    ] = None,
    min_samples: Annotated[int | None, typer.Option(help="Samples a gate needs.")] = None,
    token: Token = None,
) -> None:
    """Start a canary rollout."""
    body: dict[str, Any] = {}
    if spec is not None:
        loaded = yaml.safe_load(spec.read_text())
        if not isinstance(loaded, dict):
            typer.echo(f"kvgate rollout: {spec} must hold a mapping", err=True)
            raise typer.Exit(2)
        body.update(loaded)
    options = {
        "model": model,
        "baseline": baseline,
        "canary": canary,
        "name": name,
        "min_step_duration_s": min_step_s,
        "min_requests_per_step": min_requests,
        "analysis_window_s": window_s,
        "interval_s": interval_s,
    }
    body.update({k: v for k, v in options.items() if v is not None})
    if steps is not None:
        try:
            body["steps"] = [float(s) for s in steps.split(",") if s.strip()]
        except ValueError:
            typer.echo(f"kvgate rollout: --steps must be numbers, got {steps!r}", err=True)
            raise typer.Exit(2) from None
    gates: dict[str, Any] = dict(body.get("gates") or {})
    if max_error_rate is not None:
        gates["max_error_rate"] = max_error_rate
    for key, factor, bound in (
        ("latency_p99", p99_factor, p99_max_s),
        ("ttft_p99", ttft_p99_factor, ttft_p99_max_s),
    ):
        if factor is not None or bound is not None:
            gates[key] = {
                k: v for k, v in (("max_factor", factor), ("max_s", bound)) if v is not None
            }
    if quality_min is not None:
        gates["quality"] = {"min_mean": quality_min}
    if min_samples is not None:
        gates["min_samples"] = min_samples
    if gates:
        body["gates"] = gates
    status = _run(gateway, "POST", "/admin/rollouts", token, body)
    render_status(status, Console())


@rollout_app.command()
def status(
    gateway: Gateway,
    rollout: Annotated[str | None, typer.Argument(help="Rollout id (all when omitted).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    token: Token = None,
) -> None:
    """Show a rollout's state, step, weights and each gate's current value."""
    if rollout is None:
        data = _run(gateway, "GET", "/admin/rollouts", token)
        statuses = data.get("rollouts", [])
    else:
        statuses = [_run(gateway, "GET", f"/admin/rollouts/{quote(rollout, safe='/')}", token)]
    if as_json:
        typer.echo(json.dumps(statuses if rollout is None else statuses[0], indent=2))
        return
    console = Console()
    if not statuses:
        console.print("no rollouts")
    for item in statuses:
        render_status(item, console)


def _action(action: str) -> None:
    def command(
        rollout: Annotated[str, typer.Argument(help="Rollout id (model/canary by default).")],
        gateway: Gateway,
        token: Token = None,
        step: Annotated[
            bool, typer.Option("--step", help="promote: move one step, not all the way.")
        ] = False,
    ) -> None:
        path = f"/admin/rollouts/{quote(rollout, safe='/')}/{action}"
        if step and action == "promote":
            path += "?step=true"
        render_status(_run(gateway, "POST", path, token), Console())

    command.__doc__ = {
        "pause": "Hold the rollout at its step (gates are still judged).",
        "resume": "Continue a paused rollout.",
        "promote": "Make the canary the stable version now.",
        "abort": "Roll back now: canary weight 0.",
    }[action]
    rollout_app.command(action)(command)


for _name in ("pause", "resume", "promote", "abort"):
    _action(_name)
