"""Writing back what a replica bound locally while Redis was unreachable (``RedisStore``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvgate.store.memory import MemoryStore
from kvgate.store.scripts import Scripts
from kvgate.types import Seconds, SessionKey, WorkerId


async def push_dirty(
    batch: list[tuple[SessionKey, WorkerId | None]],
    local: MemoryStore,
    scripts: Scripts,
    pipe: Any,
    dirty: Mapping[SessionKey, WorkerId | None],
) -> None:
    """Push one batch of dirty sessions: deletes as conditional deletes, bindings as
    compare-and-sets expecting the local worker (Redis wins a conflict, and the local
    copy adopts what is in force unless it was rewritten since: still in ``dirty``).

    ``pipe``: a pipeline to queue on, or ``None`` to run each call at once (a cluster).
    """
    t = local.clock()
    direct: list[Any] = []
    queued: list[tuple[SessionKey, Seconds] | None] = []  # one per queued command
    for key, deleted_from in batch:
        if deleted_from is not None:
            direct.append(await scripts.delete(key, deleted_from, pipe))
            queued.append(None)
            continue
        affinity = local.table.get(key, t)
        deadline = local.table.deadline(key, t)
        if affinity is None or deadline is None:
            continue  # expired locally meanwhile: nothing to claim
        direct.append(
            await scripts.compare_and_set(key, affinity.worker, affinity, deadline - t, pipe)
        )
        queued.append((key, deadline - t))
    if not queued:
        return
    replies = direct if pipe is None else await pipe.execute()
    for pushed, reply in zip(queued, replies, strict=True):
        if pushed is not None and pushed[0] not in dirty:
            key, ttl = pushed
            _, in_force = Scripts.decode_cas(key, reply)
            await local.set(in_force, ttl)
