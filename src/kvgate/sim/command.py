"""``kvgate sim``: compare routing policies on one workload in virtual time."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvgate.extras import require
from kvgate.sim.experiment import Experiment
from kvgate.sim.report import print_tables, results_csv, results_json
from kvgate.sim.simulation import Progress as ProgressFn
from kvgate.sim.simulation import SimConfig
from kvgate.tables import (
    FormatOption,
    OutputFormat,
    WideOption,
    emit,
    json_text,
    message_console,
)
from kvgate.workload.options import TraceOption, WorkloadOption, workload_factory, write_results
from kvgate.workload.synthetic import parse_options

DEFAULT_REQUESTS = 2000
"""Requests taken from an endless synthetic workload when neither a count nor a duration is set."""


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _parse_sweep(text: str | None) -> tuple[str | None, list[str]]:
    if not text:
        return None, []
    param, sep, values = text.partition("=")
    if not sep or not _split(values):
        raise typer.BadParameter("expected PARAM=v1,v2,...", param_hint="--sweep")
    return param.strip().replace("-", "_"), _split(values)


def _parse_slowdown(text: str) -> tuple[float, int, float]:
    at, worker, speed = [*text.split(":"), "", ""][:3]
    try:
        return float(at), int(worker), float(speed)
    except ValueError:
        raise ValueError(f"--slowdown expects AT:WORKER:SPEED, got {text!r}") from None


def sim(
    *,
    workload: WorkloadOption = None,
    trace: TraceOption = None,
    workers: Annotated[int, typer.Option(min=1, help="Workers in the fleet")] = 4,
    policies: Annotated[
        str, typer.Option(help="Comma-separated policy names to compare")
    ] = "round_robin,least_request,prefix_affinity,default",
    seed: Annotated[
        int, typer.Option(help="Seed of the workload and the policies' randomness")
    ] = 0,
    rate_scale: Annotated[
        float, typer.Option(min=0.0, help="Multiply the arrival rate (traces: replay faster)")
    ] = 1.0,
    out: Annotated[Path | None, typer.Option(help="Write results.json and plots here")] = None,
    requests: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many requests")
    ] = None,
    duration: Annotated[
        float | None, typer.Option(min=0.0, help="Stop arrivals after this many simulated seconds")
    ] = None,
    profile: Annotated[
        str, typer.Option(help="Engine latency profile(s), comma-separated, given out in turn")
    ] = "h100-llama3-8b",
    kv_blocks: Annotated[
        str, typer.Option(help="KV blocks per worker (comma-separated, in turn); 0 = GPU's")
    ] = "0",
    block_size: Annotated[int, typer.Option(min=1, help="Engine KV block size (tokens)")] = 64,
    scrape_interval: Annotated[
        float, typer.Option(min=0.001, help="Seconds between worker metric scrapes")
    ] = 2.0,
    max_in_flight: Annotated[
        int | None, typer.Option(min=1, help="The gateway's in-flight limit per worker")
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option(help="Policy option KEY=VALUE for every policy that has it (repeatable)"),
    ] = None,
    sweep: Annotated[
        str | None,
        typer.Option(help="PARAM=v1,v2,...: rerun for each value (rate, workers, a threshold...)"),
    ] = None,
    misses: Annotated[
        bool,
        typer.Option(
            help="Say where each policy's cache misses went: new text, shared text "
            "recomputed, later turns (before their previous one finished, evicted at home, moved)"
        ),
    ] = False,
    as_peer: Annotated[
        str,
        typer.Option(
            help="Comma-separated policies to run as a peer router runs them: without the "
            "gateway's memory-pressure handling and KV gate (sglang-router, smg and "
            "vllm-router have neither), e.g. cache_aware"
        ),
    ] = "",
    open_loop: Annotated[
        bool,
        typer.Option(
            help="Send every request at its arrival, a later turn even before its previous "
            "turn's reply exists (by default it waits for it, as clients and the live replay do)"
        ),
    ] = False,
    client_concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The most requests the clients have out at once, as `kvgate bench "
            "--concurrency` and benchmarks/peers.py send them (default: no cap)",
        ),
    ] = None,
    slowdown: Annotated[
        list[str] | None,
        typer.Option(
            help="AT:WORKER:SPEED: from model second AT, worker index WORKER runs at SPEED "
            "times its profile's rate (0.5: half speed mid-run; repeatable)"
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    wide: WideOption = False,
    output: FormatOption = OutputFormat.TABLE,
) -> None:
    """Compare routing policies on one workload in virtual time (discrete-event simulation)."""
    # Before the run, not after it: the results need numpy, --out's plots matplotlib.
    require("numpy", "sim")
    if out is not None:
        require("matplotlib", "sim")
    console = message_console(output, wide)
    try:
        make = workload_factory(
            workload=workload,
            trace=str(trace) if trace is not None else None,
            seed=seed,
            rate_scale=rate_scale,
        )
        limit = requests
        if limit is None and duration is None and workload is not None:
            limit = DEFAULT_REQUESTS
        config = SimConfig(
            workers=workers,
            profiles=tuple(_split(profile)),
            kv_blocks=tuple(int(v) for v in _split(kv_blocks)),
            block_size=block_size,
            scrape_interval=scrape_interval,
            seed=seed,
            max_requests=limit,
            duration=duration,
            turns_wait=not open_loop,
            client_concurrency=client_concurrency,
            slowdowns=tuple(_parse_slowdown(item) for item in slowdown or ()),
        )
        if max_in_flight is not None:
            admission = config.admission.model_copy(update={"worker_max_in_flight": max_in_flight})
            config = dataclasses.replace(config, admission=admission)
        for index in range(min(workers, len(config.profiles) * len(config.kv_blocks))):
            config.engine_config(index)  # unknown profiles fail here
        policy_options: dict[str, object] = {}
        for item in option or []:
            policy_options.update(parse_options(item))
        sweep_param, sweep_values = _parse_sweep(sweep)
        experiment = Experiment(
            make,
            _split(policies),
            config,
            policy_options,
            sweep_param,
            sweep_values,
            misses=misses,
            as_peers=frozenset(_split(as_peer)),
        )
        experiment.check()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc

    if progress:
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )

        def track(label: str, total: int) -> ProgressFn:
            task = bar.add_task(label, total=total)
            return lambda done: bar.update(task, completed=done)

        with bar:
            points = experiment.run(track)
    else:
        points = experiment.run()

    wall = [{run.policy: run.wall_s for run in point.runs} for point in points]
    results = results_json(points, config, sweep_param, policy_options)
    if output is OutputFormat.JSON:
        emit(json_text(results))
    elif output is OutputFormat.CSV:
        emit(results_csv(points))
    else:
        print_tables(console, points, wall, wide=wide)
    if out is not None:
        from kvgate.sim.plots import write_plots  # matplotlib loads only when plots are asked for

        write_results(out / "results.json", results)
        written = write_plots(points, out, sweep_param)
        console.print(f"wrote {out / 'results.json'} and {', '.join(p.name for p in written)}")


def register(app: typer.Typer) -> None:
    """Add ``kvgate sim`` to the command line."""
    app.command("sim")(sim)
