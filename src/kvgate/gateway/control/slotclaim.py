"""Which share of the llama.cpp workers' slots, and which file names, are this replica's.

Gateway replicas that share llama.cpp workers and their save folder must not pin
the same slots nor write the same files: one would overwrite the other's KV, and
both would report the restore as a success. Ownership is claimed in the shared
store: ``slots.replicas`` (R) indexes per ``slots.file_prefix``, each a lease
(``slots:<prefix>:<k>``) held by one replica and renewed while it runs. Replica
``k`` pins only slots ``s`` with ``s % R == k`` and names its files
``<prefix>-r<k>-<cell>.bin`` (``<prefix>-<cell>.bin`` when R is 1).

A replica that finds every index held (more replicas than ``slots.replicas``, or
two sharing one prefix) waits one lease time for one to come free (a replica that
died without releasing), then refuses to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from kvgate.gateway.config import ConfigError
from kvgate.store.base import AffinityStore
from kvgate.tasks import cancel_and_wait

log = logging.getLogger("kvgate.gateway.control.slotclaim")

LEASE_S = 15.0
"""How long a claim outlives its replica (renewed every third of it)."""


class SlotClaimError(ConfigError):
    """Every replica index of the slot prefix is held by another replica (exit status 2)."""


class SlotClaim:
    """This replica's index among ``replicas`` sharing ``prefix``, held as a store lease."""

    def __init__(
        self,
        store: AffinityStore,
        prefix: str,
        replicas: int,
        *,
        lease_s: float | None = None,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.replicas = replicas
        self.lease_s = LEASE_S if lease_s is None else lease_s
        self.holder = os.urandom(8).hex()
        self.index: int | None = None
        self._renewing: asyncio.Task[None] | None = None

    def _lease(self, index: int) -> str:
        return f"slots:{self.prefix}:{index}"

    async def acquire(self, *, wait_s: float | None = None) -> int:
        """Claim the lowest free index; ``SlotClaimError`` after ``wait_s`` (a lease time)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.lease_s + 1.0 if wait_s is None else wait_s)
        while True:
            for index in range(self.replicas):
                if await self.store.acquire_lease(self._lease(index), self.holder, self.lease_s):
                    self.index = index
                    self._renewing = loop.create_task(self._renew())
                    log.info(
                        "slots: replica %d of %d for file prefix %r (slots s %% %d == %d)",
                        index, self.replicas, self.prefix, self.replicas, index,
                    )  # fmt: skip
                    return index
            if loop.time() >= deadline:
                raise SlotClaimError(
                    f"slots: all {self.replicas} replica index(es) of slots.file_prefix "
                    f"{self.prefix!r} are held by other gateway replicas sharing this store; "
                    "set slots.replicas to the number of replicas sharing these workers, or "
                    "give this replica its own slots.file_prefix"
                )
            await asyncio.sleep(min(1.0, self.lease_s / 3))

    async def _renew(self) -> None:
        assert self.index is not None
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if not await self.store.acquire_lease(
                self._lease(self.index), self.holder, self.lease_s
            ):
                log.error(
                    "slots: lost the claim on replica index %d of %r (the store was "
                    "unreachable longer than %.0f s?); another replica may now pin the "
                    "same slots",
                    self.index, self.prefix, self.lease_s,
                )  # fmt: skip

    async def release(self) -> None:
        """Give the index back (a clean stop), so a restarted replica need not wait."""
        await cancel_and_wait(self._renewing)
        self._renewing = None
        if self.index is not None:
            with contextlib.suppress(Exception):
                await self.store.release_lease(self._lease(self.index), self.holder)
            self.index = None

    def owns(self, slot: int) -> bool:
        """True for the slots this replica pins (all of them before a claim)."""
        return self.index is None or slot % self.replicas == self.index

    def filename(self, cell: int) -> str:
        """The file cell ``cell`` is saved in."""
        if self.replicas == 1 or self.index is None:
            return f"{self.prefix}-{cell}.bin"
        return f"{self.prefix}-r{self.index}-{cell}.bin"
