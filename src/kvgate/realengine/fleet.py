"""Several llama.cpp workers started together, and made cold again between runs.

``running_llamacpp_fleet(n, options)`` starts ``n`` worker processes at once
(loading the model dominates start-up, so they load side by side), waits until
all are ready and stops them all after the block. Each worker gets its own
``slot_save_path``, which turns on llama.cpp's slot API, so ``reset()`` can
erase every slot's KV. The fleet forces ``cache_ram_mib=0``: llama.cpp has no
endpoint that empties the host-RAM prompt cache, and a reset that leaves it warm
would let one run inherit the previous run's cache.

Usage::

    async with running_llamacpp_fleet(2, small_options(parallel=2)) as fleet:
        fleet.urls           # worker base URLs
        await fleet.reset()  # every slot erased, once in-flight requests finish
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from kvgate.realengine.llamacpp import LlamaCppOptions
from kvgate.realengine.process import STARTUP_TIMEOUT_S, LlamaCppProcess, start_llamacpp
from kvgate.realengine.slots import reset_prefix_cache


class LlamaCppFleet:
    """Running llama.cpp workers; satisfies the demo's ``Fleet`` protocol."""

    def __init__(self, processes: list[LlamaCppProcess]) -> None:
        self.processes = processes

    @property
    def urls(self) -> list[str]:
        """Every worker's base URL (also its ``X-Kvgate-Worker`` id)."""
        return [p.url for p in self.processes]

    async def reset(self, timeout_s: float = 120.0) -> None:
        """Wait for every worker to go idle, then erase all its slots: a cold fleet."""
        await asyncio.gather(*(reset_prefix_cache(url, timeout_s) for url in self.urls))


def fleet_options(
    options: LlamaCppOptions, workdir: Path, slot_dir: Path | None = None
) -> LlamaCppOptions:
    """``options`` made resettable: slot API on (saves under ``slot_dir``, by default
    ``workdir/slots``), no RAM cache."""
    slots = slot_dir if slot_dir is not None else workdir / "slots"
    return dataclasses.replace(options, slot_save_path=slots, cache_ram_mib=0)


def _make_folders(*folders: Path | None) -> None:
    for folder in folders:
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)


@contextlib.asynccontextmanager
async def running_llamacpp_fleet(
    workers: int,
    options: LlamaCppOptions,
    *,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    workdir: Path | None = None,
    slot_dir: Path | None = None,
) -> AsyncIterator[LlamaCppFleet]:
    """``workers`` ready llama.cpp workers with ``options`` (port 0 is best), then stopped.

    Each worker logs under ``workdir/worker-<i>`` (default: a new temporary folder).
    With ``slot_dir`` every worker saves and restores slots in that one folder, so a
    slot saved on one can be restored on another (migration with KV).
    """
    if workers < 1:
        raise ValueError("the fleet needs at least one worker")
    root = workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="kvgate-fleet-"))
    processes: list[LlamaCppProcess] = []
    try:
        for i in range(workers):
            folder = root / f"worker-{i}"
            _make_folders(folder / "slots", slot_dir)
            processes.append(start_llamacpp(fleet_options(options, folder, slot_dir), folder))
        await asyncio.gather(*(p.wait_ready_async(startup_timeout) for p in processes))
        yield LlamaCppFleet(processes)
    finally:
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in processes))
