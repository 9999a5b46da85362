"""``open_store``: a store from a URL, as config and the command line name it."""

from __future__ import annotations

from typing import Any

from kvgate.store.base import AffinityStore
from kvgate.store.memory import MemoryStore
from kvgate.store.redis_store import RedisStore


def open_store(url: str = "memory", **options: Any) -> AffinityStore:
    """A store for ``url``: ``"memory"``, ``"redis://host:port/db"`` (also ``rediss://``),
    or a Redis Cluster node ``"redis+cluster://host:port"``.

    ``options`` go to the backend's constructor; options meant for the other backend
    are a ``TypeError``, as are unknown URLs a ``ValueError``, so config mistakes
    show at start-up.
    """
    if url in ("memory", "memory://"):
        return MemoryStore(**options)
    if url.startswith(
        ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")
    ):
        return RedisStore(url, **options)
    raise ValueError(f"unknown store URL {url!r}: expected 'memory' or 'redis://host:port/db'")
