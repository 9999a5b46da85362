"""Redis Cluster URLs and key prefixes for ``RedisStore``."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from redis.asyncio.cluster import ClusterNode


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
    if "{" in prefix and "}" in prefix.split("{", 1)[1]:
        return prefix
    stem = prefix.rstrip(":")
    return f"{{{stem}}}:" if stem else "{kvgate}:"
