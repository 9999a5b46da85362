"""Affinity and rollout state behind one async interface.

``MemoryStore`` is the default (one gateway process); ``RedisStore`` is shared by
gateway replicas. ``open_store(url)`` picks one from a URL.
"""

from kvgate.store.base import AffinityStore
from kvgate.store.memory import MemoryStore
from kvgate.store.opening import open_store
from kvgate.store.redis_store import RedisStore
from kvgate.store.table import SessionTable

__all__ = ["AffinityStore", "MemoryStore", "RedisStore", "SessionTable", "open_store"]
