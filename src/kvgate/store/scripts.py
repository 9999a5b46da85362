"""The Redis side of ``RedisStore``: key layout, Lua scripts, and reply decoding.

Key layout under a prefix ``P`` (default ``kvgate:``):

- ``P s:<session>``: hash ``w`` (worker), ``v`` (version), ``t`` (last_active), with
  the binding's TTL as the key's own expiry;
- ``P wa:<worker>``: sorted set of the worker's sessions scored by last_active
  (``sessions_of`` order);
- ``P we:<worker>``: the same sessions scored by expiry (Redis server ms), so
  expired sessions are pruned from both indexes without scanning;
- ``P workers``: set of workers that may have sessions (for ``counts``);
- ``P t:<tenant>``: sorted set of a tenant's sessions (``core.session.tenant_of``) scored by
  expiry, the key's TTL the sessions'; past its bound (``max_per_scope``, split evenly over
  the shards) the soonest to expire (the least recently written or touched) are dropped, so
  one client's flood of ids costs Redis at most its own bound, never another's bindings;
- ``P pfx:<block>``: the worker a prefix block was last sent to (``core.holders``), a plain
  string with a TTL; shared by every tenant (a common opening is anyone's evidence);
- ``P pt:<tenant>``: sorted set of the blocks a tenant wrote last, scored by expiry (its
  ``max_holders_per_scope``, split evenly over the shards): past it the soonest to expire
  are dropped, each only while it is still the tenant's write (the value ends with
  ``HOLDER_SEP`` and the writer's tenant under a bound: ``holder_worker`` reads it);
- ``P blob:<name>`` and ``P lease:<name>``: rollout state and leases;
- ``P epoch``: a token that says the data is still there (``store.epoch``).

Every write that touches a binding runs as one Lua script, so the binding and both
indexes change together and compare-and-set is atomic across gateway replicas.
Scripts derive index keys from the prefix they are given. On Redis Cluster the
sessions are spread over shards (``cluster.shard_prefixes``), each prefix with a
hash tag of its own: a session, and the indexes of its shard, share a slot, so
each script runs on one slot; ``sessions_of`` and ``counts`` visit every shard.
Scripts without a key of their own pass ``P workers`` as KEYS[1] so the cluster
client routes them to that slot.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Mapping, Sequence
from typing import Any

import xxhash
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript

from kvgate.core.decision import Affinity
from kvgate.core.holders import HOLDER_TAG
from kvgate.core.session import tenant_of
from kvgate.types import BlockHash, Seconds, SessionKey, WorkerId

_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function unindex(p, w, k)
  redis.call('ZREM', p .. 'wa:' .. w, k)
  redis.call('ZREM', p .. 'we:' .. w, k)
end
local function bound(p, k, tenant, ttl, cap, flag)
  if cap <= 0 then return end
  local tk = p .. 't:' .. tenant
  local now = now_ms()
  if flag then
    redis.call('ZADD', tk, flag, now + ttl, k)
  else
    redis.call('ZADD', tk, now + ttl, k)
  end
  redis.call('PEXPIRE', tk, ttl)
  if flag or redis.call('ZCARD', tk) <= cap then return end
  redis.call('ZREMRANGEBYSCORE', tk, '-inf', now)
  local over = redis.call('ZCARD', tk) - cap
  if over <= 0 then return end
  local gone = redis.call('ZPOPMIN', tk, over)
  for i = 1, #gone, 2 do
    local g = gone[i]
    local gkey = p .. 's:' .. g
    local gw = redis.call('HGET', gkey, 'w')
    if gw then
      redis.call('DEL', gkey)
      unindex(p, gw, g)
    end
  end
end
local function bind(p, skey, k, w, v, t, ttl, tenant, cap)
  local old = redis.call('HGET', skey, 'w')
  if old and old ~= w then unindex(p, old, k) end
  redis.call('HSET', skey, 'w', w, 'v', v, 't', t)
  redis.call('PEXPIRE', skey, ttl)
  redis.call('ZADD', p .. 'wa:' .. w, t, k)
  redis.call('ZADD', p .. 'we:' .. w, now_ms() + ttl, k)
  redis.call('SADD', p .. 'workers', w)
  bound(p, k, tenant, ttl, cap, false)
end
local function purge(p, w)
  local we = p .. 'we:' .. w
  local gone = redis.call('ZRANGEBYSCORE', we, '-inf', now_ms(), 'LIMIT', 0, 1000)
  while #gone > 0 do
    redis.call('ZREM', we, unpack(gone))
    redis.call('ZREM', p .. 'wa:' .. w, unpack(gone))
    gone = redis.call('ZRANGEBYSCORE', we, '-inf', now_ms(), 'LIMIT', 0, 1000)
  end
  return redis.call('ZCARD', we)
end
"""

# KEYS[1] session; ARGV: prefix, session key
_GET = """
local cur = redis.call('HMGET', KEYS[1], 'w', 'v', 't')
if not cur[1] then return false end
return {cur[1], cur[2], cur[3], redis.call('PTTL', KEYS[1])}
"""

# KEYS[1] session; ARGV: prefix, session, worker, version, last_active, ttl_ms, tenant,
# bound (0: none)
_SET = """
bind(ARGV[1], KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), ARGV[7],
  tonumber(ARGV[8]))
return 1
"""

# KEYS[1] session; ARGV: prefix, session, has_expected, expected, worker, version,
# last_active, ttl_ms, tenant, bound. Replies {won, worker, version, last_active}.
_CAS = """
local cur = redis.call('HMGET', KEYS[1], 'w', 'v', 't')
if cur[1] and not (ARGV[3] == '1' and cur[1] == ARGV[4]) then
  return {0, cur[1], cur[2], cur[3]}
end
bind(ARGV[1], KEYS[1], ARGV[2], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8]), ARGV[9],
  tonumber(ARGV[10]))
return {1, ARGV[5], ARGV[6], ARGV[7]}
"""

# KEYS[1] session; ARGV: prefix, session, last_active, ttl_ms, tenant, bound
_TOUCH = """
local w = redis.call('HGET', KEYS[1], 'w')
if not w then return 0 end
local ttl = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 't', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', ARGV[1] .. 'wa:' .. w, ARGV[3], ARGV[2])
redis.call('ZADD', ARGV[1] .. 'we:' .. w, now_ms() + ttl, ARGV[2])
bound(ARGV[1], ARGV[2], ARGV[5], ttl, tonumber(ARGV[6]), 'XX')
return 1
"""

# KEYS[1] session; ARGV: prefix, session, only_if_worker ('' = whoever), tenant
_DELETE = """
local w = redis.call('HGET', KEYS[1], 'w')
if not w then return 0 end
if ARGV[3] ~= '' and w ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[1])
unindex(ARGV[1], w, ARGV[2])
redis.call('ZREM', ARGV[1] .. 't:' .. ARGV[4], ARGV[2])
return 1
"""

# ARGV: prefix, worker, stop index (-1 = all). Replies flat {session, version, t, ...}.
_SESSIONS_OF = """
local p, w = ARGV[1], ARGV[2]
purge(p, w)
local out = {}
for _, k in ipairs(redis.call('ZRANGE', p .. 'wa:' .. w, 0, tonumber(ARGV[3]))) do
  local cur = redis.call('HMGET', p .. 's:' .. k, 'w', 'v', 't')
  if cur[1] == w then
    out[#out + 1] = k
    out[#out + 1] = cur[2]
    out[#out + 1] = cur[3]
  end
end
return out
"""

# ARGV: prefix. Replies flat {worker, count, ...}.
_COUNTS = """
local p = ARGV[1]
local out = {}
for _, w in ipairs(redis.call('SMEMBERS', p .. 'workers')) do
  local n = purge(p, w)
  if n == 0 then
    redis.call('SREM', p .. 'workers', w)
  else
    out[#out + 1] = w
    out[#out + 1] = n
  end
end
return out
"""

# KEYS[1] the tenant's holder set; ARGV: the holder keys' prefix, ttl_ms, bound, the
# writer's tag (HOLDER_SEP tenant), then (block, worker) pairs. Replies the blocks dropped.
_HOLD = """
local hp, ttl, cap, tag, tk = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], KEYS[1]
local expires, scored = now_ms() + ttl, {}
for i = 5, #ARGV, 2 do
  redis.call('SET', hp .. ARGV[i], ARGV[i + 1] .. tag, 'PX', ttl)
  scored[#scored + 1] = expires
  scored[#scored + 1] = ARGV[i]
end
redis.call('ZADD', tk, unpack(scored))
redis.call('PEXPIRE', tk, ttl)
if redis.call('ZCARD', tk) <= cap then return 0 end
redis.call('ZREMRANGEBYSCORE', tk, '-inf', now_ms())
local over = redis.call('ZCARD', tk) - cap
if over <= 0 then return 0 end
local gone = redis.call('ZPOPMIN', tk, over)
local dropped = 0
for i = 1, #gone, 2 do
  local hk = hp .. gone[i]
  local v = redis.call('GET', hk)
  -- Written since by another tenant: its evidence, on its own bound.
  if v and string.sub(v, -#tag) == tag then
    redis.call('DEL', hk)
    dropped = dropped + 1
  end
end
return dropped
"""

# KEYS[1] epoch; ARGV: this replica's token. Replies what was there (nil: it was gone,
# and the token is there now). See ``store.epoch``.
_EPOCH = """
local cur = redis.call('GET', KEYS[1])
if not cur then redis.call('SET', KEYS[1], ARGV[1]) end
return cur
"""

# KEYS[1] lease; ARGV: holder, ttl_ms
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS[1] lease; ARGV: holder
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

Client = Redis | Pipeline


HOLD_MAX = 1000
"""Prefix blocks one holder script writes at most (a flush's batch may hold many more)."""

HOLDER_SEP = "\x1f"
"""Between a bounded holder's worker and the tenant that wrote it (no worker id has one)."""


def holder_worker(value: Any) -> WorkerId:
    """The worker a holder key's value names (a bounded write's ends with its writer)."""
    return _text(value).partition(HOLDER_SEP)[0]


def ttl_ms(ttl: Seconds) -> int:
    """A TTL in whole milliseconds, at least 1 (Redis rejects 0)."""
    return max(1, round(ttl * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def decode_affinity(key: SessionKey, worker: Any, version: Any, last_active: Any) -> Affinity:
    """An ``Affinity`` from a script's reply fields."""
    return Affinity(key, _text(worker), _text(version), float(_text(last_active)))


class Scripts:
    """The store's Lua scripts bound to one client, with typed argument builders.

    Each method queues on a pipeline when given one (and returns what the
    pipeline returns) or runs at once; ``decode_*`` turn raw replies into values.
    """

    def __init__(
        self,
        redis: Redis | RedisCluster,
        prefix: str,
        shards: Sequence[str] = (),
        max_per_scope: int | None = None,
        max_holders_per_scope: int | None = None,
    ) -> None:
        self.prefix = prefix
        """Blobs, leases and the epoch live under it (and, unsharded, everything)."""
        self.shards = list(shards) or [prefix]
        """The prefixes sessions and holders are spread over (one: ``prefix``)."""
        self.bound = 0 if max_per_scope is None else -(-max_per_scope // len(self.shards))
        """A tenant's sessions kept per shard (``P t:<tenant>``); 0: not bounded."""
        shares = len(self.shards)
        self.holder_bound = (
            0 if max_holders_per_scope is None else -(-max_holders_per_scope // shares)
        )
        """A tenant's prefix-holder blocks kept per shard (``P pt:<tenant>``); 0: not bounded."""

        def register(body: str) -> AsyncScript:
            return redis.register_script(_COMMON + body)

        self._get = register(_GET)
        self._set = register(_SET)
        self._cas = register(_CAS)
        self._touch = register(_TOUCH)
        self._delete = register(_DELETE)
        self._sessions_of = register(_SESSIONS_OF)
        self._counts = register(_COUNTS)
        self._acquire = register(_ACQUIRE)
        self._release = register(_RELEASE)
        self._hold = register(_HOLD)
        self._epoch = redis.register_script(_EPOCH)

    def shard(self, key: str) -> str:
        """The prefix ``key``'s binding (and its indexes) live under."""
        shards = self.shards
        if len(shards) == 1:
            return shards[0]
        return shards[xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogatepass")) % len(shards)]

    def session_key(self, key: SessionKey) -> str:
        """The Redis key holding ``key``'s binding."""
        return f"{self.shard(key)}s:{key}"

    def holder_key(self, block: BlockHash) -> str:
        """The Redis key holding the worker ``block`` was last sent to (``core.holders``)."""
        name = f"{block & 0xFFFFFFFFFFFFFFFF:016x}"
        return f"{self.shard(name)}{HOLDER_TAG}{name}"

    async def hold(
        self, shard: str, tenant: str, expire_ms: int, pairs: Sequence[str], client: Client | None
    ) -> Any:
        """Queue or run the writes of holders of one shard by one tenant (``pairs``: block
        name, worker, ...), bounded by ``holder_bound``: replies the blocks it dropped."""
        tag = HOLDER_SEP + tenant
        args: list[str | int] = [shard + HOLDER_TAG, expire_ms, self.holder_bound, tag, *pairs]
        return await self._hold([f"{shard}pt:{tenant}"], args, client)

    def holder_groups(
        self, batch: Mapping[BlockHash, tuple[WorkerId, int, str]]
    ) -> list[tuple[tuple[str, str, int], list[str]]]:
        """``batch`` as the ``hold`` calls that write it: per (shard, tenant, expiry), the
        (block name, worker) pairs, ``HOLD_MAX`` blocks a call at most."""
        groups: dict[tuple[str, str, int], list[str]] = {}
        for block, (worker, expire_ms, tenant) in batch.items():
            name = f"{block & 0xFFFFFFFFFFFFFFFF:016x}"
            groups.setdefault((self.shard(name), tenant, expire_ms), []).extend((name, worker))
        # At most HOLD_MAX blocks a call (Lua's ``unpack`` takes some 8,000 values).
        return [
            (group, pairs[low : low + 2 * HOLD_MAX])
            for group, pairs in groups.items()
            for low in range(0, len(pairs), 2 * HOLD_MAX)
        ]

    async def write_holders(
        self,
        redis: Redis | RedisCluster,
        batch: Mapping[BlockHash, tuple[WorkerId, int, str]],
        parallel: int | None,
    ) -> list[Any]:
        """Write ``batch`` in one round trip: plain ``SET``s, or with a per-tenant bound one
        ``hold`` per shard and tenant; ``parallel``: a cluster's (scripts in a cluster
        pipeline do not reload after a failover), so that many calls at once."""
        if self.holder_bound and parallel is not None:
            groups = list(self.holder_groups(batch))
            out: list[Any] = []
            for low in range(0, len(groups), parallel):
                chunk = groups[low : low + parallel]
                calls = (self.hold(s, t, ms, p, None) for (s, t, ms), p in chunk)
                out.extend(await asyncio.gather(*calls))
            return out
        pipe: Any = redis.pipeline(transaction=False)
        if self.holder_bound:
            for (shard, tenant, expire_ms), pairs in self.holder_groups(batch):
                await self.hold(shard, tenant, expire_ms, pairs, pipe)
        else:
            for block, (worker, ms, _) in batch.items():
                pipe.set(self.holder_key(block), worker, px=ms)
        replies: list[Any] = await pipe.execute()
        return replies

    def blob_key(self, name: str) -> str:
        """The Redis key holding blob ``name``."""
        return f"{self.prefix}blob:{name}"

    def lease_key(self, name: str) -> str:
        """The Redis key holding lease ``name``."""
        return f"{self.prefix}lease:{name}"

    async def get(self, key: SessionKey, client: Client | None = None) -> Any:
        """Queue or run a read of ``key``: reply is fields and PTTL, or nil."""
        return await self._get([self.session_key(key)], [self.shard(key), key], client)

    @staticmethod
    def decode_get(key: SessionKey, reply: Any) -> tuple[Affinity, Seconds] | None:
        """The binding and its remaining TTL in seconds, or ``None``."""
        if not reply:
            return None
        worker, version, last_active, pttl = reply
        remaining = int(pttl) / 1000 if int(pttl) > 0 else 0.0
        return decode_affinity(key, worker, version, last_active), remaining

    async def set(self, affinity: Affinity, ttl: Seconds, client: Client | None = None) -> Any:
        """Queue or run an unconditional bind."""
        key = affinity.session_key
        return await self._set(
            [self.session_key(key)],
            [self.shard(key), key, affinity.worker, affinity.version, repr(affinity.last_active),
             ttl_ms(ttl), tenant_of(key), self.bound],
            client,
        )  # fmt: skip

    async def compare_and_set(
        self,
        key: SessionKey,
        expected: WorkerId | None,
        affinity: Affinity,
        ttl: Seconds,
        client: Client | None = None,
    ) -> Any:
        """Queue or run a compare-and-set; decode with ``decode_cas``."""
        args = [
            self.shard(key),
            key,
            "0" if expected is None else "1",
            expected or "",
            affinity.worker,
            affinity.version,
            repr(affinity.last_active),
            ttl_ms(ttl),
            tenant_of(key),
            self.bound,
        ]
        return await self._cas([self.session_key(key)], args, client)

    @staticmethod
    def decode_cas(key: SessionKey, reply: Any) -> tuple[bool, Affinity]:
        """Whether the write won, and the binding in force."""
        won, worker, version, last_active = reply
        return bool(int(won)), decode_affinity(key, worker, version, last_active)

    async def touch(
        self, key: SessionKey, now: Seconds, ttl: Seconds, client: Client | None = None
    ) -> Any:
        """Queue or run a touch; reply 1 if the binding existed."""
        args: list[str | int] = [self.shard(key), key, repr(now), ttl_ms(ttl), tenant_of(key)]
        args.append(self.bound)
        return await self._touch([self.session_key(key)], args, client)

    async def delete(
        self, key: SessionKey, only_if_worker: WorkerId = "", client: Client | None = None
    ) -> Any:
        """Queue or run a delete (only if bound to ``only_if_worker``, when given)."""
        return await self._delete(
            [self.session_key(key)], [self.shard(key), key, only_if_worker, tenant_of(key)], client
        )

    async def sessions_of(self, worker: WorkerId, limit: int | None) -> list[Affinity]:
        """Live bindings to ``worker``, least recently active first."""
        stop = -1 if limit is None else limit - 1
        if stop < -1 or limit == 0:
            return []
        found: list[list[Affinity]] = []
        for shard in self.shards:  # one at a time: a rare call, and one connection
            # KEYS[1] is not read: it routes the call to the slot's node on Redis Cluster.
            reply: Sequence[Any] = await self._sessions_of(
                [f"{shard}workers"], [shard, worker, stop]
            )
            found.append(
                [
                    decode_affinity(_text(reply[i]), worker, reply[i + 1], reply[i + 2])
                    for i in range(0, len(reply), 3)
                ]
            )
        merged = list(heapq.merge(*found, key=lambda a: a.last_active))
        return merged if limit is None else merged[:limit]

    async def counts(self) -> dict[WorkerId, int]:
        """Live sessions per worker (pruning expired ones as it goes)."""
        counts: dict[WorkerId, int] = {}
        for shard in self.shards:
            reply: Sequence[Any] = await self._counts([f"{shard}workers"], [shard])
            for i in range(0, len(reply), 2):
                worker = _text(reply[i])
                counts[worker] = counts.get(worker, 0) + int(reply[i + 1])
        return counts

    async def acquire_lease(self, name: str, holder: str, ttl: Seconds) -> bool:
        """Take or renew lease ``name``; True if ``holder`` holds it afterwards."""
        reply = await self._acquire([self.lease_key(name)], [holder, ttl_ms(ttl)])
        return bool(int(reply))

    async def epoch(self, token: str) -> str | None:
        """The epoch key's value, or ``None`` when it was gone (then ``token`` is set)."""
        reply = await self._epoch([f"{self.prefix}epoch"], [token])
        return None if reply is None else _text(reply)

    async def release_lease(self, name: str, holder: str) -> bool:
        """Drop lease ``name`` if ``holder`` holds it."""
        reply = await self._release([self.lease_key(name)], [holder])
        return bool(int(reply))
