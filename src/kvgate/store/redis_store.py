"""``RedisStore``: affinity state shared by gateway replicas through Redis.

A request never fails because the store did. Every call goes to Redis with short
socket timeouts; the results are mirrored into a local ``MemoryStore``. A call that
fails is tried once more, at once: one timeout is no outage (on a busy host a
connect or a reply can miss a 100 ms deadline while Redis is fine, and a replica
that degraded on it would bind new sessions alone, disagreeing with the others).
When the second try fails too, the store turns **degraded**: it logs once, serves
every call from the local map (marking what it writes there as dirty), and probes
Redis in the background with exponential backoff. When Redis answers again the
dirty bindings are written back and the store serves from Redis again.

Retrying is safe because every call is idempotent in effect: a compare-and-set
whose first try landed finds its own binding in force and returns it; set, touch,
blob writes and lease renewals write the same values again. Only the replies of a
retried ``delete`` or ``release_lease`` may say False when the first try did it.

Lost data is seen, not only outages: every ``epoch_check_s`` (1 s) the store checks
its epoch key (``store.epoch``); when it is gone (a ``FLUSHALL``, Redis restarted
without persistence, the key evicted) or was rewritten by another replica that found
it gone, the loss is logged once and counted (``kvgate_store_data_lost_total``).

Degraded is the availability side of a trade-off, not a silent one: while Redis is
unreachable a replica routes on its own (a misplaced request costs a cache miss; a
refused one would cost the client its answer), it says so (a warning, and the
``kvgate_store_degraded`` gauge and ``kvgate_store_fallbacks`` counter), and the
resync settles every conflict in Redis's favour when it returns.

Resync rule: for each binding made or refreshed locally during the outage, a
compare-and-set that expects the local worker. So where Redis has no binding (it
expired, or Redis restarted empty) or the same worker, ours is written; where another
replica bound the session elsewhere meanwhile, Redis wins and we adopt its binding.
Sessions deleted locally are deleted in Redis only if still bound to the worker we
deleted them from (any worker, if this replica never knew the binding). Bindings that
were in Redis before the outage but only mirrored here are not written back: after a
Redis restart they are re-placed on first use, like any unknown session. Blobs
written locally are written back (last writer wins). Leases are never granted while
degraded, only renewed by the holder this process already recorded: no controller
for a while is safer than two.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Literal, TypeVar

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError

from kvgate.core.decision import Affinity
from kvgate.redaction import redact
from kvgate.store.base import AffinityStore
from kvgate.store.batching import Batch, HolderWrites, TouchThrottle
from kvgate.store.cluster import (
    cluster_prefix,
    drop_idle_connections,
    has_tag,
    is_cluster_url,
    make_client,
    shard_prefixes,
)
from kvgate.store.epoch import Epoch
from kvgate.store.health import StoreHealth
from kvgate.store.loads import RedisLoads
from kvgate.store.memory import Clock, MemoryStore
from kvgate.store.readcache import ReadCache
from kvgate.store.resync import push_dirty
from kvgate.store.scripts import Scripts, holder_worker
from kvgate.tasks import cancel_and_wait
from kvgate.types import BlockHash, Seconds, SessionKey, WorkerId

logger = logging.getLogger(__name__)

T = TypeVar("T")

_ANY_WORKER: Final = ""  # dirty marker: deleted locally without knowing the worker
_RESYNC_BATCH: Final = 256


class _Down(enum.Enum):
    DOWN = 0


_DOWN: Final = _Down.DOWN

_RESYNC_ROUNDS = 8
"""Batches pushed while still degraded before new calls go back to Redis (see try_recover)."""

_FAILURES = (RedisError, OSError)  # OSError covers socket errors and asyncio timeouts

_ATTEMPTS = 2
"""Tries of one call before the store turns degraded (see the module docstring)."""


class RedisStore(AffinityStore):
    """An ``AffinityStore`` in Redis, with a local fallback map for outages.

    ``errors_total`` (failed Redis round trips, probes included), ``degraded``,
    ``fallbacks_total`` (calls answered locally during outages) and
    ``resyncs_total`` (outages recovered from) are for the gateway's metrics.

    Options: ``prefix`` namespaces every key; ``socket_timeout``/``connect_timeout``
    bound how long a sick Redis can hold up one call; ``backoff_initial``/``_max``
    pace the background probes; ``max_connections`` bounds the pool;
    ``fallback_max_sessions`` bounds the local map and ``max_dirty`` the bindings
    remembered for resync (oldest dropped first, counted in ``dirty_dropped_total``);
    ``max_per_scope`` bounds one tenant's sessions and ``max_holders_per_scope`` the prefix
    blocks it wrote last, in Redis and the local map (``None``: not bounded): what a client
    can make the gateway write (``scripts``).
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "kvgate:",
        socket_timeout: Seconds = 0.1,
        connect_timeout: Seconds = 0.25,
        backoff_initial: Seconds = 0.05,
        backoff_max: Seconds = 2.0,
        fallback_max_sessions: int = 1_000_000,
        max_dirty: int = 100_000,
        max_connections: int = 32,
        epoch_check_s: Seconds = 1.0,
        cluster_shards: int = 16,
        touch_interval_s: Seconds = 5.0,
        read_cache: bool = True,
        max_per_scope: int | None = None,
        max_holders_per_scope: int | None = None,
        clock: Clock = time.monotonic,
        client: Redis | RedisCluster | None = None,
    ) -> None:
        self.url = url
        self._url_for_logs = redact(url)
        self.cluster = is_cluster_url(url) or isinstance(client, RedisCluster)
        shards: list[str] = []
        if self.cluster:
            # Spread over the masters, unless the operator's prefix pins one tag.
            if not has_tag(prefix) and cluster_shards > 1:
                shards = shard_prefixes(prefix, cluster_shards)
            prefix = cluster_prefix(prefix)
        if client is None:
            args = (max_connections, socket_timeout, connect_timeout)
            client = make_client(url, self.cluster, *args)
        self._redis: Any = client
        # The cluster client refuses (MaxConnectionsError) rather than waits for a
        # connection past max_connections: calls wait here instead. Half for calls,
        # half for the parallel reads of get_many, which holds one call slot.
        self._batch = max(1, max_connections // 2)
        self._calls = asyncio.Semaphore(self._batch) if self.cluster else None
        self._scripts = Scripts(self._redis, prefix, shards, max_per_scope, max_holders_per_scope)
        self.local = MemoryStore(
            fallback_max_sessions,
            clock,
            max_per_scope=max_per_scope,
            max_holders_per_scope=max_holders_per_scope,
        )
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._max_dirty = max_dirty
        # session -> None (push on resync) or the worker it was deleted from locally
        self._dirty: dict[SessionKey, WorkerId | None] = {}
        self._dirty_blobs: set[str] = set()
        self._degraded = False
        self._errors_total = 0
        self.fallbacks_total = 0
        self.resyncs_total = 0
        self.dirty_dropped_total = 0
        self.degraded_total = 0
        self._recovery: asyncio.Task[None] | None = None
        self._recovering = asyncio.Lock()
        self._closed = False
        self._epoch = Epoch()
        self._epoch_check_s = epoch_check_s
        self._epoch_watch: asyncio.Task[None] | None = None
        self.data_lost_total = 0
        self._holder_writes = HolderWrites(self._write_holders)
        self._loads = RedisLoads(self._redis, self._scripts.prefix)
        self._touches = TouchThrottle(touch_interval_s)
        self._cache = (
            ReadCache(self._redis, self._scripts.prefix)
            if read_cache and isinstance(self._redis, Redis) and not self.cluster
            else None
        )

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable and calls are answered locally."""
        return self._degraded

    @property
    def errors_total(self) -> int:
        """Failed Redis round trips since the store was opened."""
        return self._errors_total

    def health(self) -> StoreHealth:
        """The counters the gateway exports (``kvgate_store_*``)."""
        return StoreHealth(
            errors_total=self._errors_total,
            degraded=self._degraded,
            fallbacks_total=self.fallbacks_total,
            resyncs_total=self.resyncs_total,
            degraded_total=self.degraded_total,
            dirty_dropped_total=self.dirty_dropped_total,
            data_lost_total=self.data_lost_total,
        )

    @property
    def prefix(self) -> str:
        """The namespace every key of this store starts with."""
        return self._scripts.prefix

    # -- bindings ---------------------------------------------------------------

    async def get(self, key: SessionKey) -> Affinity | None:
        """The live binding for ``key``, or ``None``: from the read cache while Redis has
        not said it changed (``store.readcache``), else read."""
        cache, now = self._cache, self.local.clock()
        if cache is not None and (hit := cache.get(key, now)) is not None:
            return hit
        ticket = cache.ticket() if cache is not None else 0
        reply = await self._remote(lambda: self._scripts.get(key))
        if reply is _DOWN:
            return await self.local.get(key)
        decoded = Scripts.decode_get(key, reply)
        await self._mirror(key, decoded)
        if cache is not None and decoded is not None:
            cache.put(ticket, key, decoded[0], now, now + decoded[1])
        return None if decoded is None else decoded[0]

    async def get_many(self, keys: Sequence[SessionKey]) -> list[Affinity | None]:
        """``get`` for many keys, pipelined into one round trip."""

        async def fetch() -> list[Any]:
            if self.cluster:  # scripts in a cluster pipeline do not reload after a failover
                out: list[Any] = []
                for low in range(0, len(keys), self._batch):
                    chunk = keys[low : low + self._batch]
                    out.extend(await asyncio.gather(*(self._scripts.get(k) for k in chunk)))
                return out
            pipe = self._redis.pipeline(transaction=False)
            for key in keys:
                await self._scripts.get(key, pipe)
            replies: list[Any] = await pipe.execute()
            return replies

        replies = await self._remote(fetch)
        if replies is _DOWN:
            return await self.local.get_many(keys)
        return [
            await self._mirror(key, Scripts.decode_get(key, reply))
            for key, reply in zip(keys, replies, strict=True)
        ]

    async def get_holders(self, blocks: Sequence[BlockHash]) -> list[WorkerId | None]:
        """Where each prefix block was last sent, by any replica: one ``MGET``.

        Plain keys with a TTL, apart from the sessions (no per-worker index: they
        are evidence of cached blocks, not sessions to drain or count).
        """
        if not blocks:
            return []
        keys = [self._scripts.holder_key(block) for block in blocks]
        # On a cluster the keys are spread over slots: one MGET per slot, in parallel.
        mget = self._redis.mget_nonatomic if self.cluster else self._redis.mget
        reply = await self._remote(lambda: mget(keys))
        if reply is _DOWN:
            return await self.local.get_holders(blocks)
        return [None if v is None else holder_worker(v) for v in reply]

    async def set_holders(
        self, entries: Sequence[tuple[BlockHash, WorkerId]], ttl: Seconds, tenant: str = ""
    ) -> None:
        """Record where prefix blocks were sent, pipelined into one round trip."""
        if not entries:
            return
        expire_ms = max(1, int(ttl * 1000))
        await self._write_holders({block: (w, expire_ms, tenant) for block, w in entries})
        # Kept locally too, so an outage keeps this replica's own evidence.
        await self.local.set_holders(entries, ttl, tenant)

    def set_holders_soon(
        self,
        entries: Sequence[tuple[BlockHash, WorkerId]],
        ttl: Seconds,
        failed: Callable[[], None],
        tenant: str = "",
    ) -> None:
        """``set_holders`` coalesced with other requests' into one round trip (``batching``);
        the local copy is written at once."""
        if entries:
            self.local.holders.set_many(entries, self.local.clock(), ttl, tenant)
            self._holder_writes.add(entries, max(1, int(ttl * 1000)), failed, tenant)

    async def _write_holders(self, batch: Batch) -> None:
        parallel = self._batch if self.cluster else None
        await self._remote(lambda: self._scripts.write_holders(self._redis, batch, parallel))

    async def set(self, affinity: Affinity, ttl: Seconds) -> None:
        """Bind ``affinity.session_key`` unconditionally for ``ttl`` seconds."""
        self._changing(affinity.session_key)
        reply = await self._remote(lambda: self._scripts.set(affinity, ttl))
        if reply is _DOWN:
            self._mark_dirty(affinity.session_key, None)
        await self.local.set(affinity, ttl)

    async def compare_and_set(
        self, key: SessionKey, expected_worker: WorkerId | None, affinity: Affinity, ttl: Seconds
    ) -> Affinity:
        """Atomically bind ``key`` unless another binding is in force; the binding in force."""
        self._changing(key)
        reply = await self._remote(
            lambda: self._scripts.compare_and_set(key, expected_worker, affinity, ttl)
        )
        if reply is _DOWN:
            result = await self.local.compare_and_set(key, expected_worker, affinity, ttl)
            if result.worker == affinity.worker:
                self._mark_dirty(key, None)
            return result
        _, result = Scripts.decode_cas(key, reply)
        await self.local.set(result, ttl)
        return result

    async def touch(self, key: SessionKey, now: Seconds, ttl: Seconds) -> bool:
        """Record activity at ``now`` and extend the binding by ``ttl``; False if unbound.

        Redis is told at most once per ``touch_interval_s`` per session (``TouchThrottle``):
        between, the binding's TTL is far from running out and the local copy keeps time.
        """
        if not self._touches.due(key, self.local.clock()) and await self.local.touch(key, now, ttl):
            return True
        self._changing(key)
        reply = await self._remote(lambda: self._scripts.touch(key, now, ttl))
        local = await self.local.touch(key, now, ttl)
        if reply is _DOWN:
            if local:
                self._mark_dirty(key, None)
            return local
        if int(reply):
            self._touches.sent(key, self.local.clock())
        return bool(int(reply))

    async def delete(self, key: SessionKey) -> bool:
        """Forget ``key``'s binding; False if there was none."""
        self._changing(key)
        reply = await self._remote(lambda: self._scripts.delete(key))
        known = await self.local.get(key)
        await self.local.delete(key)
        if reply is _DOWN:
            self._mark_dirty(key, known.worker if known else _ANY_WORKER)
            return known is not None
        return bool(int(reply))

    def _changing(self, key: SessionKey) -> None:
        """This process writes ``key``: its cached read is stale from now on."""
        if self._cache is not None:
            self._cache.drop(key)

    async def sessions_of(self, worker: WorkerId, limit: int | None = None) -> list[Affinity]:
        """Bindings to ``worker``, least recently active first (local ones while degraded)."""
        reply = await self._remote(lambda: self._scripts.sessions_of(worker, limit))
        return await self.local.sessions_of(worker, limit) if reply is _DOWN else reply

    async def counts(self) -> dict[WorkerId, int]:
        """Live sessions per worker (this replica's local view while degraded)."""
        reply = await self._remote(self._scripts.counts)
        return await self.local.counts() if reply is _DOWN else reply

    async def exchange_loads(self, replica: str, data: bytes, ttl: Seconds) -> dict[str, bytes]:
        """One script (``store.loads``); while Redis is down, this replica's counts alone."""
        reply = await self._remote(lambda: self._loads.exchange(replica, data, ttl))
        return {replica: data} if reply is _DOWN else reply

    # -- blobs and leases -------------------------------------------------------

    async def get_blob(self, name: str) -> bytes | None:
        """A named opaque value, or ``None``."""
        key = self._scripts.blob_key(name)
        reply = await self._remote(lambda: self._redis.get(key))
        if reply is _DOWN:
            return await self.local.get_blob(name)
        if reply is None:
            return None
        data = reply.encode() if isinstance(reply, str) else reply
        await self.local.put_blob(name, data)
        return data

    async def put_blob(self, name: str, data: bytes) -> None:
        """Store a named opaque value; the last writer wins."""
        key = self._scripts.blob_key(name)
        reply = await self._remote(lambda: self._redis.set(key, data))
        if reply is _DOWN:
            self._dirty_blobs.add(name)
        await self.local.put_blob(name, data)

    async def acquire_lease(self, name: str, holder: str, ttl: Seconds) -> bool:
        """Take or renew lease ``name``; while degraded, only renew one already held."""
        reply = await self._remote(lambda: self._scripts.acquire_lease(name, holder, ttl))
        if reply is _DOWN:  # renewed by the holder recorded here, never granted anew
            held = self.local.lease_holder(name) == holder
            return held and await self.local.acquire_lease(name, holder, ttl)
        if reply:
            self.local.grant_lease(name, holder, ttl)
        else:
            await self.local.release_lease(name, holder)
        return reply

    async def release_lease(self, name: str, holder: str) -> bool:
        """Give up lease ``name`` if ``holder`` holds it."""
        reply = await self._remote(lambda: self._scripts.release_lease(name, holder))
        local = await self.local.release_lease(name, holder)
        return local if reply is _DOWN else reply

    async def check_epoch(self) -> bool:
        """Check now whether the store lost its data (see ``store.epoch``); True if it did."""
        reply = await self._remote(lambda: self._scripts.epoch(self._epoch.token))
        if reply is _DOWN or not self._epoch.observe(reply):
            return False
        self.data_lost_total += 1
        logger.warning(
            "affinity store lost its data: the epoch key at redis %s was gone (FLUSHALL, a "
            "restart without persistence, or eviction); sessions bound before are re-placed "
            "on their next request",
            self._url_for_logs,
        )
        return True

    async def _watch_epoch(self) -> None:
        while not self._closed:
            # Sleep first: the call that started the watch has Redis to itself.
            await asyncio.sleep(self._epoch_check_s)
            await self.check_epoch()

    async def close(self) -> None:
        """Stop probing, close connections, forget the local map."""
        self._closed = True
        await self._holder_writes.close()
        if self._cache is not None:
            await self._cache.stop()
        await cancel_and_wait(self._recovery, self._epoch_watch)
        await self._redis.aclose()
        await self.local.close()

    # -- failure handling -------------------------------------------------------

    async def _remote(self, call: Callable[[], Awaitable[T]]) -> T | Literal[_Down.DOWN]:
        """Run ``call`` against Redis (tried twice), or say it is down (and turn degraded)."""
        if self._epoch_watch is None and not self._closed:
            # Started by the first call, so the store can be made outside an event loop.
            self._epoch_watch = asyncio.get_running_loop().create_task(self._watch_epoch())
        if self._cache is not None and not self._degraded and not self._closed:
            self._cache.start()  # (again, after its connections were lost)
        for attempt in range(_ATTEMPTS):
            if self._degraded:  # also when another call degraded it during our first try
                self.fallbacks_total += 1
                return _DOWN
            try:
                if self._calls is None:
                    reply = await call()
                else:
                    async with self._calls:
                        reply = await call()
                break
            except _FAILURES as exc:
                self._errors_total += 1
                if attempt + 1 < _ATTEMPTS:
                    continue  # redis-py closed the failed connection; the next try opens one
                self.fallbacks_total += 1
                self._enter_degraded(exc)
                return _DOWN
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # redis-py can swallow a cancellation that lands inside a command and
            # return its reply (redis/redis-py#2028, #2551): pass it on, so a request
            # whose client went away stops here instead of going on to a worker.
            raise asyncio.CancelledError
        return reply

    async def _mirror(
        self, key: SessionKey, found: tuple[Affinity, Seconds] | None
    ) -> Affinity | None:
        if found is None:
            await self.local.delete(key)
            return None
        affinity, remaining = found
        if remaining > 0:
            await self.local.set(affinity, remaining)
        return affinity

    def _mark_dirty(self, key: SessionKey, deleted_from: WorkerId | None) -> None:
        self._dirty.pop(key, None)  # re-insert so the dict stays oldest-first
        self._dirty[key] = deleted_from
        if len(self._dirty) > self._max_dirty:
            del self._dirty[next(iter(self._dirty))]
            self.dirty_dropped_total += 1

    def _enter_degraded(self, exc: BaseException) -> None:
        if self._degraded or self._closed:
            return
        self._degraded = True
        self.degraded_total += 1
        if self._cache is not None:
            self._cache.clear()  # invalidations may be missed from now on
        logger.warning(
            "affinity store degraded: redis at %s unreachable (%s: %s); "
            "serving from the local fallback map until it returns",
            self._url_for_logs,
            type(exc).__name__,
            redact(str(exc)),
        )
        if self._recovery is None or self._recovery.done():
            self._recovery = asyncio.get_running_loop().create_task(self._recover())

    async def try_recover(self) -> bool:
        """Probe Redis now and, if it answers, resync and leave degraded mode.

        True if the store is healthy afterwards. The background task calls this
        with backoff; an operator (or a test) may call it to skip the wait.
        """
        async with self._recovering:
            if not self._degraded:
                return True
            try:
                # Connections pooled before the outage are dead (reset, or to the Redis
                # that was restarted): each would fail once more and flip the store back
                # to degraded. Drop them all; the probe and what follows open fresh ones.
                await drop_idle_connections(self._redis)
                await self._redis.ping()
                caught_up = await self._resync(rounds=_RESYNC_ROUNDS)
            except _FAILURES:
                self._errors_total += 1
                return False
            # Caught up: nothing dirty and no await since, safe to flip. Else traffic
            # dirties bindings as fast as they are pushed (it would chase them forever,
            # degraded all along): new calls go to Redis from now on, and what is still
            # dirty is pushed after, compare-and-set, so a newer binding in Redis wins.
            self._degraded = False
            if not caught_up:
                try:
                    await self._resync()
                except _FAILURES as exc:
                    self._errors_total += 1
                    self._enter_degraded(exc)
                    return False
            self.resyncs_total += 1
            logger.warning(
                "affinity store recovered: redis at %s is back, resynced", self._url_for_logs
            )
            return True

    async def _recover(self) -> None:
        delay = self._backoff_initial
        while self._degraded:
            await asyncio.sleep(delay)
            if await self.try_recover():
                break
            delay = min(delay * 2, self._backoff_max)
        if self._recovery is asyncio.current_task():
            self._recovery = None

    async def _resync(self, rounds: int | None = None) -> bool:
        """Write back what was done locally while degraded, until nothing is dirty (True),
        or until ``rounds`` batches of bindings were pushed (False if any is left)."""
        while self._dirty_blobs:
            name = self._dirty_blobs.pop()
            data = await self.local.get_blob(name)
            try:
                if data is not None:
                    await self._redis.set(self._scripts.blob_key(name), data)
            except _FAILURES:
                self._dirty_blobs.add(name)
                raise
        pushed = 0
        while self._dirty:
            if rounds is not None and pushed >= rounds:
                return False
            pushed += 1
            batch = [self._dirty.popitem() for _ in range(min(_RESYNC_BATCH, len(self._dirty)))]
            try:
                # On a cluster each call runs at once: a script a node lacks (after a
                # failover, Redis does not replicate its script cache) is reloaded only
                # outside a pipeline.
                pipe = None if self.cluster else self._redis.pipeline(transaction=False)
                await push_dirty(batch, self.local, self._scripts, pipe, self._dirty)
            except _FAILURES:
                for key, deleted_from in batch:
                    self._dirty.setdefault(key, deleted_from)
                raise
        return True
