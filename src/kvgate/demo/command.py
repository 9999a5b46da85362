"""``kvgate demo``: the routing policies compared live, on an emulated fleet, in seconds."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvgate.demo.fleet import FleetSpec
from kvgate.demo.runner import DEFAULT_POLICIES, DEMO_WORKLOAD, DemoConfig, run_demo
from kvgate.demo.table import demo_table
from kvgate.sim.report import write_results

_DEFAULTS = DemoConfig()


def demo(
    *,
    workers: Annotated[int, typer.Option(min=1, help="Emulated workers in the fleet")] = (
        _DEFAULTS.fleet.workers
    ),
    policies: Annotated[
        str, typer.Option(help="Comma-separated policies to compare, in order")
    ] = ",".join(DEFAULT_POLICIES),
    requests: Annotated[int, typer.Option(min=1, help="Requests per policy")] = _DEFAULTS.requests,
    time_scale: Annotated[
        float, typer.Option(min=0.0, help="Model seconds per real second")
    ] = _DEFAULTS.fleet.time_scale,
    profile: Annotated[
        str, typer.Option(help="Engine latency profile of every worker")
    ] = _DEFAULTS.fleet.profile,
    kv_blocks: Annotated[
        int, typer.Option(min=1, help="KV-cache blocks per worker (small: routing matters)")
    ] = _DEFAULTS.fleet.kv_blocks or 1000,
    workload: Annotated[
        str, typer.Option(help="Synthetic workload NAME[:key=value,...]")
    ] = DEMO_WORKLOAD,
    seed: Annotated[int, typer.Option(help="Seed of the workload and the fleet")] = 0,
    out: Annotated[Path | None, typer.Option(help="Write results.json here")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    verbose: Annotated[
        bool, typer.Option(help="Show the gateway's and workers' own log lines")
    ] = False,
) -> None:
    """Start an emulated fleet and compare routing policies through the real gateway."""
    if not verbose:
        # Pressure and health transitions are the demo working as intended; the table
        # is the output. Errors still show.
        logging.getLogger("kvgate").setLevel(logging.ERROR)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    try:
        fleet = FleetSpec(
            workers=workers,
            profile=profile,
            time_scale=time_scale,
            kv_blocks=kv_blocks,
            seed=seed,
        )
        config = DemoConfig(
            fleet=fleet,
            policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
            workload=workload,
            requests=requests,
            seed=seed,
        )
        config.check()
        from kvgate.workersim import WorkerOptions

        WorkerOptions(profile=profile)  # an unknown profile fails here
    except (ValueError, KeyError) as exc:
        raise typer.BadParameter(str(exc)) from None

    if progress:
        bar = Progress(
            TextColumn("{task.description:>18}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        tasks = {name: bar.add_task(name, total=requests) for name in config.policies}

        def tick(policy: str, done: int, total: int) -> None:
            bar.update(tasks[policy], completed=done, total=total)

        with bar:
            results = asyncio.run(run_demo(config, progress=tick))
    else:
        results = asyncio.run(run_demo(config))
    console.print(demo_table(results))
    if out is not None:
        write_results(out / "results.json", results)
        console.print(f"wrote {out / 'results.json'}")


def register(app: typer.Typer) -> None:
    """Add ``kvgate demo`` to the command line."""
    app.command("demo")(demo)
