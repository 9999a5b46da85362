"""The replicas' published in-flight counts (``core.peers``), in memory and in Redis.

``LoadTable`` is the in-process half: what ``MemoryStore`` serves (replicas sharing
one process's store, tests) and the simulator's replicas exchange through in virtual
time. ``RedisLoads`` keeps the same in one Redis hash (field: the replica; value: its
expiry in Redis's own clock, then its counts), written and read by one script: one
round trip a period, no replica's clock involved, expired fields deleted as met.
"""

from __future__ import annotations

from typing import Any

from kvgate.core.peers import MAX_REPLICAS
from kvgate.types import Seconds


class LoadTable:
    """Replica -> (expiry, its published counts), at most ``max_replicas`` of them."""

    def __init__(self, max_replicas: int = MAX_REPLICAS) -> None:
        self.max_replicas = max_replicas
        self._entries: dict[str, tuple[Seconds, bytes]] = {}

    def exchange(self, replica: str, data: bytes, now: Seconds, ttl: Seconds) -> dict[str, bytes]:
        """Publish ``data`` as ``replica``'s until ``now + ttl``; every live publication."""
        entries = self._entries
        for name in [n for n, (until, _) in entries.items() if until <= now]:
            del entries[name]
        if replica in entries or len(entries) < self.max_replicas:
            entries[replica] = (now + ttl, data)
        return {name: value for name, (_, value) in entries.items()}


_EXCHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local out = {}
local live = 0
local seen = redis.call('HGETALL', KEYS[1])
for i = 1, #seen, 2 do
  local cut = string.find(seen[i + 1], ' ', 1, true)
  local until_ms = cut and tonumber(string.sub(seen[i + 1], 1, cut - 1))
  if not until_ms or until_ms <= now then
    redis.call('HDEL', KEYS[1], seen[i])
  elseif seen[i] ~= ARGV[1] then
    live = live + 1
    out[#out + 1] = seen[i]
    out[#out + 1] = string.sub(seen[i + 1], cut + 1)
  end
end
if live < tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[1], ARGV[1], tostring(now + ttl) .. ' ' .. ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ttl)
end
out[#out + 1] = ARGV[1]
out[#out + 1] = ARGV[2]
return out
"""


class RedisLoads:
    """``LoadTable.exchange`` in Redis: one script call (the module docs)."""

    def __init__(self, client: Any, prefix: str, max_replicas: int = MAX_REPLICAS) -> None:
        self._key = f"{prefix}loads"
        self._script = client.register_script(_EXCHANGE)
        self.max_replicas = max_replicas

    async def exchange(self, replica: str, data: bytes, ttl: Seconds) -> dict[str, bytes]:
        """Publish ``data`` as ``replica``'s for ``ttl`` seconds; every live publication."""
        ttl_ms = max(1, int(ttl * 1000))
        args = [replica, data, ttl_ms, self.max_replicas]
        reply = await self._script(keys=[self._key], args=args)
        pairs = iter(reply)
        return {_text(name): _bytes(value) for name, value in zip(pairs, pairs, strict=True)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value
