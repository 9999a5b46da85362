"""Redis clients, Redis Cluster URLs and key prefixes for ``RedisStore``.

On a cluster the store's keys are spread over ``shards`` hash tags chosen so that
their slots are evenly spaced over the 16,384 (shard ``i`` in the ``i``-th
sixteenth, for 16): every master of an evenly split cluster of up to 16 masters
holds some. A session's binding and the per-worker indexes its scripts touch
share its shard's tag, so every script still runs on one slot; blobs, leases and
the epoch stay under the store's own tag.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot


def is_cluster_url(url: str) -> bool:
    """True for ``redis+cluster://`` and ``rediss+cluster://`` (a Redis Cluster)."""
    return url.startswith(("redis+cluster://", "rediss+cluster://"))


def cluster_nodes(url: str) -> dict[str, Any]:
    """``RedisCluster`` arguments from ``redis+cluster://[user:pass@]h1:p1[,h2:p2...]``.

    Several startup nodes, so a client started while one of them is down (a failed
    master) still finds the cluster; the rest of the nodes are discovered.
    """
    scheme, _, rest = url.partition("://")
    netloc = rest.split("/", 1)[0]
    userinfo, _, hosts = netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    nodes = []
    for part in hosts.split(","):
        host, _, port = part.rpartition(":")
        nodes.append(ClusterNode(host.strip("[]") or "127.0.0.1", int(port or 6379)))
    return {
        "startup_nodes": nodes,
        "username": unquote(user) or None,
        "password": unquote(password) or None,
        "ssl": scheme.startswith("rediss"),
    }


def cluster_prefix(prefix: str) -> str:
    """``prefix`` with a hash tag, so every key of the store lands in one cluster slot.

    The Lua scripts touch a binding and its worker's indexes together, and Redis
    Cluster runs a script only over keys of one slot: ``kvgate:`` becomes
    ``{kvgate}:``; a prefix that already has a tag is kept.
    """
    if has_tag(prefix):
        return prefix
    stem = prefix.rstrip(":")
    return f"{{{stem}}}:" if stem else "{kvgate}:"


def has_tag(prefix: str) -> bool:
    """True when ``prefix`` carries a hash tag of its own (then it is kept: one slot)."""
    return "{" in prefix and "}" in prefix.split("{", 1)[1]


def shard_prefixes(prefix: str, shards: int) -> list[str]:
    """``shards`` prefixes, each with a hash tag whose slot falls in its own share of the
    slots (deterministic: every replica computes the same ones)."""
    stem = prefix.strip("{}:") or "kvgate"
    width = REDIS_CLUSTER_HASH_SLOTS / shards
    out = []
    for i in range(shards):
        n = 0
        while int(key_slot(f"{stem}:{i}.{n}".encode()) // width) != i:
            n += 1
        out.append(f"{{{stem}:{i}.{n}}}:")
    return out


def make_client(
    url: str,
    cluster: bool,
    max_connections: int,
    socket_timeout: float,
    connect_timeout: float,
) -> Redis | RedisCluster:
    """The store's client: a bounded pool on one Redis, or a cluster client.

    No retries in the client: the store's own second try and its fallback absorb
    failures. A burst of requests waits briefly for a pooled connection instead of
    opening hundreds (whose connects time out on a busy host).
    """
    if cluster:
        return RedisCluster(
            **cluster_nodes(url),
            max_connections=max_connections,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0),
        )
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=connect_timeout,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        retry=Retry(NoBackoff(), 0),
    )
    return Redis.from_pool(pool)


async def drop_idle_connections(client: Redis | RedisCluster) -> None:
    """Close the idle pooled connections (one pool, or one per cluster node).

    Not those in use: a call that began before the outage may still be connecting
    on one, and closing its transport under it raised a bare ``RuntimeError`` out
    of the store. Such a connection, if dead, fails its call, which redis-py then
    closes and the call tries again on another.
    """
    if isinstance(client, RedisCluster):
        for node in client.get_nodes():
            await node.disconnect()
    else:
        await client.connection_pool.disconnect(inuse_connections=False)
