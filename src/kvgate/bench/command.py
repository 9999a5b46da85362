"""``kvgate bench``: replay a simulator workload or trace live against any OpenAI endpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvgate.bench.report import results_csv, results_table
from kvgate.bench.runner import DEFAULT_REQUESTS, run_bench
from kvgate.tables import (
    FormatOption,
    OutputFormat,
    WideOption,
    causes_table,
    emit,
    json_text,
    message_console,
)
from kvgate.workload.options import TraceOption, WorkloadOption, workload_factory, write_results
from kvgate.workload.prompts import CHARS_PER_TOKEN
from kvgate.workload.synthetic import Workload


def bench(
    *,
    target: Annotated[
        str, typer.Option(help="Base URL of an OpenAI-compatible endpoint (gateway or worker)")
    ],
    workload: WorkloadOption = None,
    trace: TraceOption = None,
    out: Annotated[Path | None, typer.Option(help="Write results.json here")] = None,
    requests: Annotated[
        int | None,
        typer.Option(min=1, help=f"Send this many requests (synthetic default {DEFAULT_REQUESTS})"),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Most requests in flight (and open connections)")
    ] = 64,
    rate_scale: Annotated[
        float, typer.Option(min=0.0, help="Multiply the arrival rate (traces: replay faster)")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic workload")] = 0,
    model: Annotated[
        str | None, typer.Option(help="Model to ask for; default: the target's first")
    ] = None,
    time_scale: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Target's model seconds per real second (emulated workers' --time-scale); "
            "arrivals are compressed by it and latencies reported in model seconds",
        ),
    ] = 1.0,
    label: Annotated[str, typer.Option(help="Name of this run in the table and results")] = "live",
    block_size: Annotated[
        int, typer.Option(min=1, help="Engine KV block size the infinite-cache bound assumes")
    ] = 16,
    chars_per_token: Annotated[
        int, typer.Option(min=1, help="Characters of prompt text per workload token")
    ] = CHARS_PER_TOKEN,
    fleet_kv_blocks: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The fleet's total KV blocks (of --block-size tokens): adds the capacity-aware "
            "reference, the fleet's KV used as one LRU cache",
        ),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="OPENAI_API_KEY", help="Bearer token for the target")
    ] = None,
    misses: Annotated[
        bool,
        typer.Option(
            "--misses",
            help="Say where the cache misses went (new text, shared text recomputed, a turn "
            "whose worker evicted it, a turn moved), by the worker each answer names",
        ),
    ] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    wide: WideOption = False,
    output: FormatOption = OutputFormat.TABLE,
) -> None:
    """Replay a workload live against an OpenAI-compatible endpoint and report like `kvgate sim`."""
    console = message_console(output, wide)
    if time_scale <= 0:
        raise typer.BadParameter("must be positive", param_hint="--time-scale")
    try:
        make = workload_factory(
            workload=workload,
            trace=str(trace) if trace is not None else None,
            seed=seed,
            rate_scale=rate_scale,
        )
        chosen: Workload = make({})
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    limit = requests if requests is not None or workload is None else DEFAULT_REQUESTS
    options: dict[str, Any] = {
        "requests": limit,
        "concurrency": concurrency,
        "model": model,
        "time_scale": time_scale,
        "label": label,
        "block_size": block_size,
        "chars_per_token": chars_per_token,
        "api_key": api_key,
        "fleet_kv_blocks": fleet_kv_blocks,
        "misses": misses,
    }
    try:
        if progress:
            bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            task = bar.add_task(f"{label} {chosen.name}", total=None)
            with bar:
                results = asyncio.run(
                    run_bench(
                        target,
                        chosen,
                        progress=lambda done, total: bar.update(task, completed=done, total=total),
                        **options,
                    )
                )
        else:
            results = asyncio.run(run_bench(target, chosen, **options))
    except (ValueError, RuntimeError, OSError) as exc:
        typer.echo(f"kvgate bench: {exc}", err=True)
        raise typer.Exit(1) from None
    if output is OutputFormat.JSON:
        emit(json_text(results))
    elif output is OutputFormat.CSV:
        emit(results_csv(results))
    else:
        console.print(results_table(results, wide=wide))
        split = [(name, s) for name, s in results["policies"].items() if "misses" in s]
        table = causes_table(split, live=True)
        if table is not None:
            console.print(table)
    if out is not None:
        write_results(out / "results.json", results)
        console.print(f"wrote {out / 'results.json'}")
    failed = _all_failed(results)
    if failed is not None:
        typer.echo(f"kvgate bench: {failed}", err=True)
        raise typer.Exit(1)


def _all_failed(results: dict[str, Any]) -> str | None:
    """What went wrong when no request of any run was answered (``None``: some were)."""
    runs = results.get("policies", {})
    if not runs or any(s.get("finished", 0) > 0 for s in runs.values()):
        return None
    kinds: dict[str, int] = {}
    total = 0
    for s in runs.values():
        total += int(s.get("requests", 0))
        for kind, n in s.get("error_kinds", {}).items():
            kinds[kind] = kinds.get(kind, 0) + int(n)
        if s.get("shed"):
            kinds["http_429 (shed)"] = kinds.get("http_429 (shed)", 0) + int(s["shed"])
    detail = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return f"every request failed ({total} sent): {detail or 'no answer'}"


def register(app: typer.Typer) -> None:
    """Add ``kvgate bench`` to the command line."""
    app.command("bench")(bench)
