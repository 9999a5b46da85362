"""``python -m kvgate.realengine engine llamacpp ...``: the worker process launchers start.

Only the engine commands are loaded, so a worker starts without importing the
rest of the CLI.
"""

from __future__ import annotations

import typer

from kvgate.realengine.command import register

app = typer.Typer(add_completion=False, no_args_is_help=True)
register(app)

if __name__ == "__main__":
    app()
