"""Running a gateway inside the current event loop: the demo, benchmarks and tests.

Product code (``demo/``) uses it directly; tests reach it through
``kvgate.gateway.testing``, which re-exports it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.gateway.app import Gateway, listen, make_runner
from kvgate.gateway.config import GatewayConfig, parse_config
from kvgate.gateway.dataplane.listener import DataPlane


@dataclass(frozen=True, slots=True)
class GatewayHandle:
    """A gateway listening in this process: its URL and its parts."""

    url: str
    gateway: Gateway
    plane: DataPlane | None = None
    """The data plane's own server, when it is the one listening (``listen.server``)."""

    @property
    def openai_base(self) -> str:
        """The ``base_url`` for an OpenAI client (``url + /v1``)."""
        return self.url + "/v1"


SERVER: str | None = None
"""The server every ``running_gateway`` listens with, over its config's ``listen.server``
(``None``: the config's): test suites set it to run once on each server."""


@contextlib.asynccontextmanager
async def running_gateway(
    config: GatewayConfig | Mapping[str, Any], **parts: Any
) -> AsyncIterator[GatewayHandle]:
    """A gateway serving ``config`` on a free port for the block's duration.

    ``parts`` go to ``Gateway`` (``policy=``, ``store=``, ``registry=``).
    """
    cfg = config if isinstance(config, GatewayConfig) else parse_config(config)
    gateway = Gateway(cfg, **parts)
    runner = make_runner(gateway)
    await runner.setup()
    plane = None
    try:
        port, plane = await listen(gateway, runner, cfg.listen.host, 0, server=SERVER)
        yield GatewayHandle(f"http://{cfg.listen.host}:{port}", gateway, plane)
    finally:
        if plane is not None:
            await plane.stop()
        await runner.cleanup()
