"""Helpers for tests and benchmarks: free ports and waiting on conditions.

Tests never sleep to wait for something: they wait on a condition, with a deadline
(``wait_until``, which lives in ``kvgate.waiting`` for product code too).
"""

from __future__ import annotations

import socket

from kvgate.waiting import wait_until, wait_until_sync

__all__ = ["free_port", "wait_until", "wait_until_sync"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
