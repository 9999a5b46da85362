"""``kvgate worker-sim``: run an emulated OpenAI-compatible worker (on uvloop)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from kvgate.workersim.options import WorkerOptions
from kvgate.workersim.runner import serve


def register(app: typer.Typer) -> None:
    """Add the ``worker-sim`` command to the ``kvgate`` CLI."""
    app.command("worker-sim")(worker_sim)


def worker_sim(
    *,
    port: Annotated[int, typer.Option(help="TCP port to listen on (0: any free port).")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    model: Annotated[str, typer.Option(help="Model name served.")] = "demo",
    version: Annotated[str, typer.Option(help="Model version reported.")] = "v1",
    profile: Annotated[str, typer.Option(help="Engine latency profile.")] = "h100-llama3-8b",
    kv_blocks: Annotated[
        int | None,
        typer.Option(help="GPU KV-cache blocks (default: what the GPU holds)."),
    ] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    time_scale: Annotated[
        float, typer.Option(help="Run this many times faster than real time.")
    ] = 1.0,
    error_rate: Annotated[float, typer.Option(help="Fraction of requests failing with 500.")] = 0.0,
    extra_latency_ms: Annotated[
        float, typer.Option(help="Added before the first byte of every answer.")
    ] = 0.0,
    speed: Annotated[
        float,
        typer.Option(
            help="Engine speed as a share of the profile's (0.5: half; "
            'POST /admin/faults {"speed": x} changes it mid-run).'
        ),
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed for output lengths and faults.")] = 0,
    max_num_seqs: Annotated[
        int | None, typer.Option(help="Most requests running at once (default: the engine's).")
    ] = None,
    max_batched_tokens: Annotated[
        int | None, typer.Option(help="Token budget of one engine step.")
    ] = None,
    cpu_offload_blocks: Annotated[int, typer.Option(help="CPU offload tier, in blocks.")] = 0,
    disk_offload_blocks: Annotated[int, typer.Option(help="Disk offload tier, in blocks.")] = 0,
    max_model_len: Annotated[
        int | None, typer.Option(help="Longest prompt + output accepted.")
    ] = None,
    no_prefix_caching: Annotated[
        bool, typer.Option("--no-prefix-caching", help="Disable prefix caching.")
    ] = False,
    slots: Annotated[
        int,
        typer.Option(help="Emulate a llama.cpp server with this many slots (0: vLLM-like)."),
    ] = 0,
    slot_save_path: Annotated[
        str | None, typer.Option(help="Folder of saved slots (llama.cpp's --slot-save-path).")
    ] = None,
    session_header: Annotated[
        str, typer.Option(help="Header naming a request's session.")
    ] = "X-Session-ID",
    kv_events_port: Annotated[
        int | None,
        typer.Option(help="Publish KV events (vLLM format, ZeroMQ) here; replay on the next port."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "info",
) -> None:
    """Run an emulated OpenAI-compatible worker driving kvgate's engine model in real time."""
    try:
        options = WorkerOptions(
            host=host,
            port=port,
            model=model,
            version=version,
            profile=profile,
            kv_blocks=kv_blocks,
            block_size=block_size,
            time_scale=time_scale,
            error_rate=error_rate,
            extra_latency_ms=extra_latency_ms,
            speed=speed,
            seed=seed,
            max_num_seqs=max_num_seqs,
            max_batched_tokens=max_batched_tokens,
            cpu_offload_blocks=cpu_offload_blocks,
            disk_offload_blocks=disk_offload_blocks,
            max_model_len=max_model_len,
            enable_prefix_caching=not no_prefix_caching,
            session_header=session_header,
            slots=slots,
            slot_save_path=slot_save_path,
            kv_events_port=kv_events_port,
        )
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    _run(serve(options))


def _run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop where it is installed, else on asyncio's loop."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)
