"""``kvgate serve``: run the gateway from a config file or from command-line options."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kvgate.core.registry import UnknownPolicyError
from kvgate.gateway.config import (
    ConfigError,
    ConfigSource,
    GatewayConfig,
    load_config,
    with_overrides,
)

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="The gateway's YAML config file.")
]
WorkerOption = Annotated[
    list[str] | None,
    typer.Option("--worker", "-w", help="A worker's base URL (repeat for each worker)."),
]
PolicyOption = Annotated[str | None, typer.Option(help="Routing policy name.")]
StoreOption = Annotated[
    str | None, typer.Option(help="Affinity store: memory or redis://HOST:PORT/DB.")
]
"""The options ``serve`` and ``epp`` share: one spelling, one help text."""


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command to the ``kvgate`` CLI."""
    app.command("serve")(serve)
    app.command("epp")(epp)


def serve(
    *,
    config: ConfigOption = None,
    worker: WorkerOption = None,
    policy: PolicyOption = None,
    port: Annotated[int | None, typer.Option(help="TCP port to listen on.")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind.")] = None,
    store: StoreOption = None,
    processes: Annotated[
        int | None,
        typer.Option(
            help="Server processes sharing the port (SO_REUSEPORT); default: one per core "
            "with a Redis store, one with the memory store (which N > 1 refuses)."
        ),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            help="What serves the generation endpoints: aiohttp, or llhttp (the data "
            "plane's own protocol-level server; every other path stays on aiohttp)."
        ),
    ] = None,
    json_logs: Annotated[
        bool | None, typer.Option("--json-logs/--text-logs", help="Logs as JSON lines.")
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(help="debug, info, warning or error (default: info).")
    ] = None,
) -> None:
    """Serve the OpenAI API in front of a fleet of workers, routing for KV-cache reuse."""
    try:
        base = load_config(config) if config is not None else GatewayConfig()
        overrides: dict[str, Any] = {
            "workers": tuple(worker or ()),
            "policy": policy,
            "host": host,
            "port": port,
            "store": store,
            "processes": processes,
            "server": server,
            "json_logs": json_logs,
            "log_level": log_level,
        }
        cfg = with_overrides(base, **overrides)
        source = None if config is None else ConfigSource(config, tuple(overrides.items()))
        # Build once here so an unknown policy or bad options fail before forking.
        from kvgate.core.policies import default_registry

        default_registry().build(cfg.policy.name, cfg.policy.options)
    except (ConfigError, UnknownPolicyError, ValueError) as exc:
        raise _refused("serve", exc) from None

    from kvgate.gateway.server import run

    try:
        status = run(cfg, source)
    except ConfigError as exc:
        raise _refused("serve", exc) from None
    raise typer.Exit(status)


def epp(
    *,
    config: ConfigOption = None,
    worker: WorkerOption = None,
    port: Annotated[int | None, typer.Option(help="The ext_proc gRPC port (epp.port).")] = None,
    http_port: Annotated[
        int | None, typer.Option(help="The HTTP port: metrics, readiness, admin (listen.port).")
    ] = None,
    policy: PolicyOption = None,
    store: StoreOption = None,
) -> None:
    """Serve as the endpoint picker of an Envoy-based gateway (ext_proc over gRPC)."""
    try:
        base = load_config(config) if config is not None else GatewayConfig()
        cfg = with_overrides(
            base, workers=tuple(worker or ()), policy=policy, port=http_port, store=store
        )
        if port is not None:
            cfg = cfg.model_copy(update={"epp": cfg.epp.model_copy(update={"port": port})})
        from kvgate.core.policies import default_registry

        default_registry().build(cfg.policy.name, cfg.policy.options)
    except (ConfigError, UnknownPolicyError, ValueError) as exc:
        raise _refused("epp", exc) from None

    from kvgate.gateway.epp import run

    raise typer.Exit(run(cfg))


def _refused(command: str, exc: Exception) -> typer.Exit:
    """Say why ``kvgate COMMAND`` cannot start; the exit (status 2) to raise."""
    typer.echo(f"kvgate {command}: {exc}", err=True)
    return typer.Exit(2)
