"""``store``: where affinities live, and what one tenant may make the store hold."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, field_validator

STORE_SCHEMES = ("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")
"""URL schemes of the shared store (``+cluster``: Redis Cluster)."""


class StoreConfig(BaseModel):
    """Where affinities live: ``memory`` (one process), ``redis://HOST:PORT/DB``, or a
    Redis Cluster (``redis+cluster://HOST:PORT``, any one node; the rest are discovered).

    ``password`` (or ``password_file``) is put into the URL, so the URL itself can
    sit in a ConfigMap and the password in a Secret.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = "memory"
    password: str | None = Field(default=None, repr=False)
    """Put into ``url``'s credentials (``password_file`` for a mounted Secret)."""
    affinity_ttl_s: float = Field(default=3600.0, gt=0)
    """How long a session's binding lives without a request."""
    timeout_s: float = Field(default=0.1, gt=0)
    """Redis: how long one reply may take. A call that fails is tried once more; a
    second failure turns the store degraded (answered locally until Redis is back)."""
    connect_timeout_s: float = Field(default=0.25, gt=0)
    """Redis: how long opening a connection (or waiting for a free pooled one) may take."""
    max_sessions_per_scope: int | None = Field(default=100_000, ge=1)
    """Bindings (session ids and stored responses' owners) one tenant (``session_scope``:
    one API key or identity; every client without one is a tenant too) keeps in the store:
    past it, its own least recently used go, never another tenant's (a client sending ever
    new ids evicted everyone's). ``null``: unbounded per tenant (the memory store still
    gives each its even share when full). Redis: split evenly over a cluster's shards."""
    max_holders_per_scope: int | None = Field(default=500_000, ge=1)
    """Prefix blocks (``core.holders``: where a prompt's checkpoint blocks went, shared by
    replicas and tenants alike) one tenant's requests keep in the store: past it, the ones
    it wrote longest ago go, never those another tenant wrote since (a client sending ever
    new prompts grew Redis for their TTL and evicted everyone's evidence from memory).
    ``null``: unbounded per tenant (Redis: plain writes, as before; memory still gives each
    its even share of its 500,000). Redis: split evenly over a cluster's shards."""

    def backend_options(self) -> dict[str, Any]:
        """Options for ``open_store``: the per-tenant bounds, and the timeouts for Redis."""
        bound = {
            "max_per_scope": self.max_sessions_per_scope,
            "max_holders_per_scope": self.max_holders_per_scope,
        }
        if self.url == "memory":
            return bound
        return {
            "socket_timeout": self.timeout_s,
            "connect_timeout": self.connect_timeout_s,
            **bound,
        }

    @property
    def effective_url(self) -> str:
        """``url`` with ``password`` in it (``url`` itself when no password is set)."""
        if self.password is None or self.url == "memory":
            return self.url
        scheme, _, rest = self.url.partition("://")
        netloc, slash, path = rest.partition("/")
        host = netloc.rpartition("@")[2]
        user = netloc.rpartition("@")[0].partition(":")[0] if "@" in netloc else ""
        secret = quote(self.password, safe="")
        return f"{scheme}://{user}:{secret}@{host}{slash}{path}"

    @field_validator("url")
    @classmethod
    def _store_url(cls, value: str) -> str:
        if value != "memory" and not value.startswith(STORE_SCHEMES):
            raise ValueError(f"must be 'memory' or a redis:// URL, got {value!r}")
        return value
