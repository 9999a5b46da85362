"""The ``kvgate`` command line. Each part registers its own subcommands here."""

from __future__ import annotations

import typer

from kvgate.extras import missing_extra

app = typer.Typer(
    name="kvgate",
    help="A KV-cache-aware, load-aware gateway for fleets of LLM inference servers.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from kvgate import __version__

        typer.echo(f"kvgate {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """A KV-cache-aware, load-aware gateway for fleets of LLM inference servers."""


def _register() -> None:
    # Each part owns a ``command`` module with ``register(app)``; registration is
    # explicit and in one place so the CLI's shape is visible here.
    from kvgate.bench import command as bench_command
    from kvgate.demo import command as demo_command
    from kvgate.gateway import command as gateway_command
    from kvgate.gateway.admin import rollout_command
    from kvgate.realengine import command as realengine_command
    from kvgate.sim import command as sim_command
    from kvgate.workersim import command as workersim_command

    workersim_command.register(app)
    gateway_command.register(app)
    sim_command.register(app)
    realengine_command.register(app)
    bench_command.register(app)
    demo_command.register(app)
    rollout_command.register(app)


_register()


def main() -> None:
    """The ``kvgate`` command: ``app``, where a missing optional dependency is one line
    naming the extra to install, not a traceback."""
    try:
        app()
    except ImportError as exc:
        missing = missing_extra(exc)
        if missing is None:
            raise
        typer.echo(f"Error: {missing}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
