"""``kvgate demo``: the routing policies compared live, on an emulated fleet, in seconds.

``--real-workers`` puts real llama.cpp workers (Gemma 3 270M on the CPU) in place
of the emulated ones, with smaller defaults so it still ends in a minute or two.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvgate.demo.fleet import FleetFactory, FleetSpec, emulated_fleet, llamacpp_fleet, real_spec
from kvgate.demo.runner import DEFAULT_POLICIES, DEMO_WORKLOAD, DemoConfig, run_demo
from kvgate.demo.table import demo_csv, demo_table
from kvgate.tables import (
    FormatOption,
    OutputFormat,
    WideOption,
    emit,
    json_text,
    message_console,
)
from kvgate.workload.options import write_results

_DEFAULTS = DemoConfig()

REAL_WORKERS = 2
REAL_POLICIES = ("round_robin", "default")
REAL_REQUESTS = 16
REAL_WORKLOAD = (
    "chat:rate=0.5,think_s=0.5,turns_mean=4,system_tokens=128,user_tokens=32,output_tokens=8"
)
"""Short multi-turn chats (a few hundred prompt tokens, 8-token answers): 16 requests per
policy take about a minute on 1-thread CPU workers, longer when the machine is busy."""


def demo(
    *,
    real_workers: Annotated[
        bool,
        typer.Option(
            "--real-workers",
            help="Real llama.cpp workers (Gemma 3 270M, 1 CPU thread and 2 slots each, "
            "needs the llamacpp extra) instead of emulated ones; wall-clock latencies. "
            "Smaller defaults (see each option) keep it to a minute or two on two cores; "
            "--profile, --time-scale and --kv-blocks do not apply. "
            "Between policies every slot is erased (llama.cpp's slot API).",
        ),
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"Workers in the fleet (default: {_DEFAULTS.fleet.workers}; "
            f"{REAL_WORKERS} with --real-workers)",
            show_default=False,
        ),
    ] = None,
    policies: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated policies to compare, in order "
            f"(default: {','.join(DEFAULT_POLICIES)}; "
            f"{','.join(REAL_POLICIES)} with --real-workers)",
            show_default=False,
        ),
    ] = None,
    requests: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"Requests per policy (default: {_DEFAULTS.requests}; "
            f"{REAL_REQUESTS} with --real-workers)",
            show_default=False,
        ),
    ] = None,
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
        str | None,
        typer.Option(
            help=f"Synthetic workload NAME[:key=value,...] (default: {DEMO_WORKLOAD}; "
            f"{REAL_WORKLOAD} with --real-workers)",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload and the fleet")] = 0,
    out: Annotated[Path | None, typer.Option(help="Write results.json here")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    verbose: Annotated[
        bool, typer.Option(help="Show the gateway's and workers' own log lines")
    ] = False,
    wide: WideOption = False,
    output: FormatOption = OutputFormat.TABLE,
) -> None:
    """Start a fleet and compare routing policies through the real gateway.

    The fleet is emulated (in-process workers in compressed time) unless
    --real-workers is given.
    """
    console = message_console(output, wide)
    factory: FleetFactory = llamacpp_fleet if real_workers else emulated_fleet
    if real_workers:
        policies = policies or ",".join(REAL_POLICIES)
        requests = requests or REAL_REQUESTS
        workload = workload or REAL_WORKLOAD
    try:
        if real_workers:
            fleet = real_spec(workers or REAL_WORKERS, seed)
        else:
            fleet = FleetSpec(
                workers=workers or _DEFAULTS.fleet.workers,
                profile=profile,
                time_scale=time_scale,
                kv_blocks=kv_blocks,
                seed=seed,
            )
        config = DemoConfig(
            fleet=fleet,
            policies=tuple(
                p.strip() for p in (policies or ",".join(DEFAULT_POLICIES)).split(",") if p.strip()
            ),
            workload=workload or DEMO_WORKLOAD,
            requests=requests or _DEFAULTS.requests,
            seed=seed,
        )
        config.check()
        from kvgate.workersim import WorkerOptions

        WorkerOptions(profile=profile)  # an unknown profile fails here
    except (ValueError, KeyError) as exc:
        raise typer.BadParameter(str(exc)) from None
    if real_workers:
        from kvgate.realengine import llamacpp_available

        if not llamacpp_available():
            typer.echo(
                "error: --real-workers needs llama.cpp; install it with: "
                "pip install 'kvgate[llamacpp]'",
                err=True,
            )
            raise typer.Exit(code=2)

    with _quiet(verbose):
        results = _run(config, factory, console, progress=progress)
    if output is OutputFormat.JSON:
        emit(json_text(results))
    elif output is OutputFormat.CSV:
        emit(demo_csv(results))
    else:
        console.print(demo_table(results, wide=wide))
    if out is not None:
        write_results(out / "results.json", results)
        console.print(f"wrote {out / 'results.json'}")


@contextlib.contextmanager
def _quiet(verbose: bool) -> Iterator[None]:
    """The 'kvgate' logger at ERROR while the fleet runs, unless ``verbose``: pressure and
    health transitions are the demo working as intended, the table is the output, errors
    still show. Its level is put back on every path (run in-process, the demo must not
    silence whoever runs it next: the rest of a test suite)."""
    logger = logging.getLogger("kvgate")
    level = logger.level
    if not verbose:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _run(
    config: DemoConfig, factory: FleetFactory, console: Console, *, progress: bool
) -> dict[str, Any]:
    """Every policy of ``config`` on a fleet of ``factory``'s, a progress bar on ``console``."""
    if progress:
        bar = Progress(
            TextColumn("{task.description:>18}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        tasks = {name: bar.add_task(name, total=config.requests) for name in config.policies}

        def tick(policy: str, done: int, total: int) -> None:
            bar.update(tasks[policy], completed=done, total=total)

        with bar:
            return asyncio.run(run_demo(config, fleet_factory=factory, progress=tick))
    return asyncio.run(run_demo(config, fleet_factory=factory))


def register(app: typer.Typer) -> None:
    """Add ``kvgate demo`` to the command line."""
    app.command("demo")(demo)
