"""``kvgate engine llamacpp``: run a real llama.cpp worker (needs the ``llamacpp`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvgate.realengine.llamacpp import LlamaCppOptions, LlamaCppUnavailableError, serve
from kvgate.realengine.model import DEFAULT_MODEL_NAME, ModelUnavailableError

engine_app = typer.Typer(
    name="engine",
    help="Run a real inference engine as a kvgate worker.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add the ``engine`` command group (``kvgate engine llamacpp``) to the CLI."""
    app.add_typer(engine_app, name="engine")


@engine_app.command("llamacpp")
def llamacpp(
    *,
    model: Annotated[
        Path | None,
        typer.Option(help="GGUF model file (default: the bundled Gemma 3 270M)."),
    ] = None,
    alias: Annotated[str, typer.Option(help="Model name served.")] = DEFAULT_MODEL_NAME,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on (0: any free port).")] = 8080,
    threads: Annotated[int, typer.Option(help="CPU threads for prefill and decode.")] = 2,
    parallel: Annotated[int, typer.Option(help="Slots: requests decoded at once.")] = 4,
    ctx: Annotated[int, typer.Option(help="Context tokens, shared by all slots.")] = 16_384,
    no_metrics: Annotated[
        bool, typer.Option("--no-metrics", help="Do not serve /metrics.")
    ] = False,
    cache_ram_mib: Annotated[
        int, typer.Option(help="Host-RAM prompt cache in MiB (0: off, -1: no limit).")
    ] = 8_192,
    cache_reuse: Annotated[
        int, typer.Option(help="Smallest chunk reused by KV shifting (0: off).")
    ] = 0,
    kv_unified: Annotated[
        bool, typer.Option("--kv-unified", help="One KV buffer shared by all slots.")
    ] = False,
    slot_similarity: Annotated[
        float, typer.Option(help="Least prefix similarity to pick a slot by its cache.")
    ] = 0.1,
    no_warmup: Annotated[
        bool, typer.Option("--no-warmup", help="Skip the warm-up run at start.")
    ] = False,
    slot_save_path: Annotated[
        Path | None,
        typer.Option(help="Folder for saved slots; enables /slots actions (erase, save, restore)."),
    ] = None,
    ready_file: Annotated[
        Path | None,
        typer.Option(hidden=True, help="Write {url, pid} here once listening."),
    ] = None,
    parent_pid: Annotated[
        int | None, typer.Option(hidden=True, help="Exit when this parent process is gone.")
    ] = None,
) -> None:
    """Serve a GGUF model with llama.cpp's own server (OpenAI API, /health, /metrics)."""
    try:
        options = LlamaCppOptions(
            model=model,
            alias=alias,
            host=host,
            port=port,
            threads=threads,
            parallel=parallel,
            ctx=ctx,
            metrics=not no_metrics,
            cache_ram_mib=cache_ram_mib,
            cache_reuse=cache_reuse,
            kv_unified=kv_unified,
            slot_similarity=slot_similarity,
            warmup=not no_warmup,
            slot_save_path=slot_save_path,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        serve(options, ready_file=ready_file, parent_pid=parent_pid)
    except (LlamaCppUnavailableError, ModelUnavailableError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


@engine_app.command("tokenizer")
def tokenizer(
    out: Annotated[Path, typer.Argument(help="Folder to write tokenizer.json into.")],
    *,
    model: Annotated[
        Path | None,
        typer.Option(help="GGUF model file (default: the bundled Gemma 3 270M)."),
    ] = None,
) -> None:
    """Write a GGUF model's own vocabulary as a Hugging Face tokenizer.json (with
    llama.cpp's ChatML template) for ``tokenizers: {kind: hf, path: OUT}``."""
    from kvgate.realengine.model import default_model_path
    from kvgate.realengine.tokenizer import write_tokenizer

    try:
        path = model or default_model_path()
        folder = write_tokenizer(path, out)
    except (ModelUnavailableError, ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(f"wrote {folder / 'tokenizer.json'} and tokenizer_config.json from {path}")
