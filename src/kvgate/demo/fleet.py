"""The demo's fleet: what it needs from workers, and the emulated fleet that provides it.

``FleetFactory`` is the seam for other kinds of fleet: anything that, given a
``FleetSpec``, opens a context yielding worker URLs and a way to make every
worker's prefix cache cold between policies. ``emulated_fleet`` runs emulated
workers in this process; ``llamacpp_fleet`` runs real llama.cpp workers
(``kvgate demo --real-workers``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from kvgate.realengine import DEFAULT_MODEL_NAME, running_llamacpp_fleet, small_options
from kvgate.waiting import wait_until
from kvgate.workersim import WorkerHandle, WorkerOptions, running_worker


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """What fleet to start: size, engine profile, compressed time and a small KV cache.

    ``time_scale`` is model seconds per real second. ``kv_blocks`` per worker is
    kept small on purpose (a few conversations' worth) so that where a request
    goes decides whether its prefix is still cached. ``kind`` names the workers
    in reports ("emulated", "llama.cpp"); the factory decides what runs.
    """

    workers: int = 4
    profile: str = "h100-llama3-8b"
    time_scale: float = 10.0
    kv_blocks: int | None = 1000
    block_size: int = 16
    model: str = "demo"
    seed: int = 0
    kind: str = "emulated"

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("the fleet needs at least one worker")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be positive")


class Fleet(Protocol):
    """A running fleet as the demo uses it."""

    @property
    def urls(self) -> list[str]:
        """Every worker's base URL (also its ``X-Kvgate-Worker`` id)."""
        ...

    async def reset(self) -> None:
        """Make every worker's prefix cache cold (once in-flight work has drained)."""
        ...


FleetFactory = Callable[[FleetSpec], AbstractAsyncContextManager[Fleet]]
"""Opens a fleet for the block's duration."""


class EmulatedFleet:
    """In-process emulated workers (``kvgate.workersim``) sharing this event loop."""

    def __init__(self, handles: list[WorkerHandle]) -> None:
        self.handles = handles

    @property
    def urls(self) -> list[str]:
        """Every worker's base URL."""
        return [h.url for h in self.handles]

    async def reset(self, timeout_s: float = 30.0) -> None:
        """Wait for every engine to go idle, then drop its cached blocks (vLLM's reset)."""
        engines = [h.engine for h in self.handles]
        await wait_until(
            lambda: not any(e.has_work() for e in engines),
            timeout=timeout_s,
            message="the fleet to go idle",
        )
        for engine in engines:
            engine.reset_prefix_cache()


def worker_options(spec: FleetSpec, index: int) -> WorkerOptions:
    """The options of worker ``index`` of an emulated fleet (free port, own seed)."""
    return WorkerOptions(
        port=0,
        model=spec.model,
        profile=spec.profile,
        kv_blocks=spec.kv_blocks,
        block_size=spec.block_size,
        time_scale=spec.time_scale,
        seed=spec.seed + index,
    )


@contextlib.asynccontextmanager
async def emulated_fleet(spec: FleetSpec) -> AsyncIterator[Fleet]:
    """``spec.workers`` emulated workers in this process for the block's duration."""
    async with contextlib.AsyncExitStack() as stack:
        handles = [
            await stack.enter_async_context(running_worker(worker_options(spec, i)))
            for i in range(spec.workers)
        ]
        yield EmulatedFleet(handles)


REAL_SLOTS = 2
"""Slots per real worker: two conversations stay warm on each, so routing matters."""


def real_spec(workers: int = 2, seed: int = 0) -> FleetSpec:
    """The spec of a real llama.cpp fleet: wall-clock time, the served model's name."""
    return FleetSpec(
        workers=workers,
        profile="cpu-small",
        time_scale=1.0,
        kv_blocks=None,
        model=DEFAULT_MODEL_NAME,
        seed=seed,
        kind="llama.cpp",
    )


@contextlib.asynccontextmanager
async def llamacpp_fleet(spec: FleetSpec) -> AsyncIterator[Fleet]:
    """``spec.workers`` real llama.cpp workers (Gemma 3 270M) in child processes.

    One thread and ``REAL_SLOTS`` slots each, no host-RAM prompt cache, so a
    worker keeps only a couple of conversations warm. ``reset()`` erases every
    slot through llama.cpp's slot API. Needs the ``llamacpp`` extra.
    """
    options = small_options(parallel=REAL_SLOTS, ctx=4_096 * REAL_SLOTS, alias=spec.model)
    async with running_llamacpp_fleet(spec.workers, options) as fleet:
        yield fleet
