"""Helpers for tests and benchmarks: free ports and waiting on conditions.

Tests never sleep to wait for something: they wait on a condition, with a deadline
(``wait_until``, which lives in ``kvgate.waiting`` for product code too).
"""

from __future__ import annotations

import socket

from kvgate.waiting import wait_until, wait_until_sync

__all__ = ["free_port", "free_port_pair", "wait_until", "wait_until_sync"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port P with P + 1 free too, a moment ago (a KV event publisher and its replay)."""
    for _ in range(100):
        port = free_port(host)
        if port >= 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")
