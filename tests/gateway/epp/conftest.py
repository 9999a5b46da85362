"""Fixtures for the endpoint picker's tests: a picker over emulated workers, an Envoy double."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from kvgate.gateway.config import parse_config
from kvgate.gateway.epp import Picker
from kvgate.store.base import AffinityStore
from kvgate.testing import wait_until

from .envoy import EnvoyLike, Mode


@contextlib.asynccontextmanager
async def running_picker(
    config: dict[str, Any], *, store: AffinityStore | None = None, ready: bool = True
) -> AsyncIterator[Picker]:
    """A started picker (gRPC and HTTP on free ports), stopped at the block's end."""
    config = {**config, "listen": {"port": 0}, "epp": {"port": 0, **config.get("epp", {})}}
    picker = Picker(parse_config(config), store=store)
    await picker.start()
    try:
        if ready:
            pool = picker.gateway.pool
            await wait_until(
                lambda: all(w.probe_ok and w.model is not None for w in pool),
                message="every worker probed",
            )
        yield picker
    finally:
        await picker.stop()


@contextlib.asynccontextmanager
async def envoy(
    picker: Picker, mode: Mode = "full_duplex", chunk: int = 64
) -> AsyncIterator[EnvoyLike]:
    """An Envoy double asking ``picker``."""
    client = EnvoyLike(f"127.0.0.1:{picker.port}", mode=mode, chunk=chunk)
    try:
        yield client
    finally:
        await client.close()


def chat(text: str, *, stream: bool = False, model: str = "demo", **extra: Any) -> bytes:
    """A chat completion request body."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "stream": stream,
        **extra,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def leases_released(picker: Picker) -> bool:
    """True when no request holds a slot on any worker."""
    return picker.gateway.pool.in_flight() == 0
