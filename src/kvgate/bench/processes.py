"""The processes a benchmark starts and measures: a free port for each, started once
it answers, stopped on every path, and the CPU time it used.

What ``bench.epp`` and the benchmark scripts (``benchmarks/overhead.py``,
``benchmarks/server_floor.py``) share, so CPU per request is counted the same way in
each of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from kvgate.waiting import wait_until_sync

_TICKS = os.sysconf("SC_CLK_TCK")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free at the moment of asking (the OS may hand it out again later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants alive now."""
    found = [pid]
    for current in found:
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                found.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by ``pid`` and its live descendants."""
    total = 0.0
    for each in tree_pids(pid):
        try:
            total += cpu_seconds(each)
        except OSError:
            continue
    return total


def answers(url: str) -> bool:
    """Whether a GET of ``url`` answers 200 now."""

    async def probe() -> bool:
        try:
            async with aiohttp.ClientSession() as session, session.get(url) as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    return asyncio.run(probe())


@contextlib.contextmanager
def running(
    argv: list[str],
    ready_url: str,
    *,
    timeout: float = 60.0,
    interval: float = 0.2,
    quiet: bool = True,
) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` running until the block ends, yielded once ``ready_url`` answers 200
    (within ``timeout`` seconds); ``quiet``: its output is discarded rather than shown."""
    output = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(argv, stdout=output, stderr=output)
    try:
        wait_until_sync(
            lambda: answers(ready_url), timeout=timeout, interval=interval, message=ready_url
        )
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
