"""Waiting on a condition with a deadline, polling (never a bare sleep).

Product code that waits for something to come up (a real engine's server,
a demo fleet) uses these; ``kvgate.testing`` re-exports them for tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


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
