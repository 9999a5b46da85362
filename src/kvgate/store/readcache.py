"""Bindings read from Redis, kept until Redis says they changed (server-assisted caching).

A request's lookup is a round trip, and most find the binding they found last time.
Redis's own invalidation protocol (``CLIENT TRACKING ... BCAST PREFIX``) tells a
connection about every change to keys under a prefix: this cache keeps what ``get``
read and drops a session the moment Redis reports its key changed (written by any
replica, touched, deleted, expired, flushed). redis-py's asyncio client has no
client-side caching of its own, so the store keeps two connections for it: one
subscribed to ``__redis__:invalidate``, one that turned tracking on and redirects the
messages there (the RESP2 form, which every Redis since 6 speaks).

Correctness rests on two rules. A reply is cached only if no invalidation arrived
while it was in flight (the messages come on another connection, so a change made
after the read may be reported before the read's reply). And while the connections
are not both up and subscribed, nothing is served from the cache and it is emptied:
a lost message must never leave a stale binding behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError

from kvgate.core.decision import Affinity
from kvgate.tasks import cancel_and_wait
from kvgate.types import Seconds, SessionKey

log = logging.getLogger(__name__)

_CHANNEL = "__redis__:invalidate"
RETRY_S = 1.0
"""Least time between two attempts to listen (each opens two connections); doubled after
each failed attempt up to ``RETRY_MAX_S`` (a Redis that refuses ``CLIENT TRACKING``)."""
RETRY_MAX_S = 60.0
MAX_AGE_S = 10.0
"""An entry is read again after this long anyway: the bound on staleness should the
listening connection die without a word (a half-open TCP connection)."""

try:  # redis-py 8: its maintenance notifications need RESP3; off on these two
    from redis.maint_notifications import MaintNotificationsConfig

    _PLAIN: Any = MaintNotificationsConfig(enabled=False)
except ImportError:  # pragma: no cover - older redis-py
    _PLAIN = None


class ReadCache:
    """Bindings by session key, valid while Redis's invalidations are being heard."""

    def __init__(self, client: Redis, prefix: str, max_entries: int = 100_000) -> None:
        self._client = client
        self._prefix = f"{prefix}s:"
        self.max_entries = max_entries
        self._entries: OrderedDict[SessionKey, tuple[Affinity, Seconds]] = OrderedDict()
        self._listening = False
        self._seq = 0
        """Invalidations heard so far: a reply is cached only if none came while it flew."""
        self._task: asyncio.Task[None] | None = None
        self._started_at = float("-inf")
        self._retry_s = RETRY_S
        self._failures = 0
        self._connections: list[AbstractConnection] = []
        self.hits = 0
        self.invalidations = 0

    @property
    def live(self) -> bool:
        """True while invalidations are heard (entries may be served)."""
        return self._listening

    def start(self) -> None:
        """Open the two connections and listen, in the background: a no-op while listening,
        and at most once per retry interval (Redis away, or refusing ``CLIENT TRACKING``)."""
        if self._task is not None and not self._task.done():
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._started_at < self._retry_s:
            return
        self._started_at = loop.time()
        self._task = loop.create_task(self._listen())

    def get(self, key: SessionKey, now: Seconds) -> Affinity | None:
        """The cached binding of ``key``, if one is known and not expired."""
        if not self._listening:
            return None
        found = self._entries.get(key)
        if found is None:
            return None
        if found[1] <= now:
            del self._entries[key]
            return None
        self.hits += 1
        return found[0]

    def ticket(self) -> int:
        """Taken before a read goes out; ``put`` it back with the reply."""
        return self._seq

    def put(
        self,
        ticket: int,
        key: SessionKey,
        affinity: Affinity | None,
        now: Seconds,
        expires: Seconds,
    ) -> None:
        """Cache what a read found at ``now`` (valid until ``expires``, its TTL), unless
        something changed while it was in flight."""
        if not self._listening or ticket != self._seq:
            return
        if affinity is None:
            self._entries.pop(key, None)
            return
        self._entries.pop(key, None)
        self._entries[key] = (affinity, min(expires, now + MAX_AGE_S))
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def drop(self, key: SessionKey) -> None:
        """This process changed ``key`` (its invalidation is on the way; do not wait)."""
        self._seq += 1
        self._entries.pop(key, None)

    def clear(self) -> None:
        """Forget everything (an outage: invalidations may have been missed)."""
        self._seq += 1
        self._entries.clear()

    def _invalidated(self, keys: Any) -> None:
        self._seq += 1
        self.invalidations += 1
        if keys is None:  # FLUSHALL / FLUSHDB
            self._entries.clear()
            return
        cut = len(self._prefix)
        for raw in keys:
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            if name.startswith(self._prefix):
                self._entries.pop(name[cut:], None)

    async def _listen(self) -> None:
        pool = self._client.connection_pool
        # RESP2 on both, whatever the pool negotiates: invalidations then arrive as
        # pub/sub messages here (as RESP3 pushes redis-py would consume them itself).
        kwargs = dict(pool.connection_kwargs, socket_timeout=None, protocol=2)
        if _PLAIN is not None:
            kwargs["maint_notifications_config"] = _PLAIN
        listener = pool.connection_class(**kwargs)
        tracker = pool.connection_class(**kwargs)
        self._connections = [listener, tracker]
        try:
            await listener.connect()  # type: ignore[no-untyped-call]
            await listener.send_command("CLIENT", "ID")
            listener_id = await listener.read_response()
            await listener.send_command("SUBSCRIBE", _CHANNEL)
            await listener.read_response(push_request=True)  # as redis-py's PubSub reads
            await tracker.connect()  # type: ignore[no-untyped-call]
            await tracker.send_command(
                "CLIENT", "TRACKING", "ON", "REDIRECT", listener_id, "BCAST",
                "PREFIX", self._prefix,
            )  # fmt: skip
            await tracker.read_response()
            self.clear()
            self._listening = True
            self._retry_s, self._failures = RETRY_S, 0
            while True:
                message = await listener.read_response(timeout=None, push_request=True)
                kind = message[0] if isinstance(message, list) and len(message) == 3 else None
                if kind in (b"message", "message"):
                    self._invalidated(message[2])
        except (RedisError, OSError) as exc:
            self._failures += 1
            self._retry_s = min(RETRY_MAX_S, RETRY_S * 2**self._failures)
            if self._failures == 1:  # once per episode, not once per attempt
                log.info("store read cache off (invalidations not heard): %s", exc)
        finally:
            self._listening = False
            self.clear()
            for connection in self._connections:
                with contextlib.suppress(Exception):
                    await connection.disconnect()
            self._connections = []

    async def stop(self) -> None:
        """Stop listening and forget everything."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self._listening = False
        self.clear()
