"""Helpers for tests and benchmarks: free ports and waiting on conditions.

Tests never sleep to wait for something: they wait on a condition, with a deadline.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout: float = 10.0,  # noqa: ASYNC109 - a polling deadline, not an I/O timeout
    interval: float = 0.01,
    message: str = "condition",
) -> None:
    """Poll ``condition`` until it is true; raise ``TimeoutError`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)


def wait_until_sync(
    condition: Callable[[], bool],
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str = "condition",
) -> None:
    """Blocking twin of ``wait_until`` for code outside an event loop."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
