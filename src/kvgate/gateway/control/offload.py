"""Offload and migration on llama.cpp workers: every request gets a slot lease.

For workers configured ``engine: llamacpp`` the proxy sends through
``SlotPlane.post`` instead of ``Upstream.post``. The plane asks the pure
``core.slotmap.SlotMap`` for a slot, carries out what the plan says in order —
save the slot's idle previous holder to disk (offload), save the session's slot
on another worker and restore it here (migration), or restore it from disk —
then sends the request with ``id_slot`` set, so the gateway always knows whose KV
each slot holds. The lease ends when the response is done with
(``UpstreamResponse.on_release``), on every path. A failed restore or
migration erases the slot and the turn is recomputed: never an error for the
client. The response carries ``X-Kvgate-KV-Tier`` (slot, disk, migrated,
shared, recompute, fallback), and ``kvgate_slot_*`` metrics count each step.

Replicas sharing workers and their folder each pin only their share of the slots
and write their own files (``slotclaim``, claimed in the shared store). What the
worker then reports cached checks every turn the map promised KV for: a slot or a
restore that turns out empty (another writer, a restarted worker) is counted
(``kvgate_slot_restores_total{result="empty"}``, ``kvgate_slot_fallbacks_total{step="verify"}``),
never reported as served from it, and the worker's slot map is rebuilt.

A new session whose prefix another session's saved slot shares has that file restored
into its slot first (``KvTier.SHARED``: a shared system prompt is read back, not computed,
on every worker reading the folder). Where only a busy slot of its worker is computing
that prefix, the request waits for it, at most as long as computing the shared part
would take it (its share of the prompt's tokens at the worker's own prefill rate, as
llama.cpp reports it in ``/metrics``): a prefix that sessions arriving together share is
then computed once per worker, not once per slot.

Each request is told what each worker would compute of its prompt, in the engine's own
tokens (``RequestFeatures.slot_uncached``, ``core.slot_turns``): from where its session's
KV is and what its last turn's usage left there; and how long the plane takes there
before sending it, as measured (a save, a restore); the policies book it so.

Migration needs nothing of its own: when the router places a session on another
worker than the one holding its KV (pressure moved its affinity, its worker is
draining, or the policy chose so), the lease on the new worker moves the KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from multidict import CIMultiDict, CIMultiDictProxy

from kvgate.core.attempt import AttemptEnd
from kvgate.core.features import RequestFeatures
from kvgate.core.prefix import FeatureConfig
from kvgate.core.slot_turns import SlotTurns
from kvgate.core.slotmap import KvTier, SlotBounds, SlotMap, SlotPlan
from kvgate.gateway.config import SlotSettings
from kvgate.gateway.control.slotclaim import SlotClaim, SlotClaimError
from kvgate.gateway.dataplane.errors import UpstreamTimeout
from kvgate.gateway.observe.metrics import SlotMetrics
from kvgate.gateway.observe.pool import Worker
from kvgate.gateway.upstream.slots import SlotActions, SlotCallError, SlotTransfer
from kvgate.gateway.upstream.transport import UpstreamResponse
from kvgate.store.base import AffinityStore
from kvgate.types import BlockHash, SessionKey, WorkerId

log = logging.getLogger("kvgate.gateway.control.offload")
_T = TypeVar("_T")

TIER_HEADER = "X-Kvgate-KV-Tier"
_DISCOVERY_RETRY_S = 5.0
_EXPECT_MAX = 4096
"""Turns awaiting their usage to check a promised slot or restore (oldest dropped)."""


class SlotPlane:
    """Slot leases, offload, restore and migration for every llama.cpp worker."""

    def __init__(
        self,
        settings: SlotSettings,
        metrics: SlotMetrics,
        *,
        wait_limit_s: float,
        store: AffinityStore | None = None,
        mono: Callable[[], float] = time.monotonic,
        features: FeatureConfig | None = None,
    ) -> None:
        self.settings = settings
        self._blocks = features if features is not None else FeatureConfig()
        self.turns = SlotTurns()
        """Each session's last turn's usage: what its next one computes (``annotate``)."""
        self.claim = (
            SlotClaim(store, settings.file_prefix, settings.replicas) if store is not None else None
        )
        """This replica's share of the slots and its file names (``None``: all, unprefixed)."""
        self._expect: OrderedDict[SessionKey, tuple[WorkerId, KvTier]] = OrderedDict()
        self.metrics = metrics
        self.wait_limit_s = wait_limit_s
        self.mono = mono
        self.map = SlotMap(SlotBounds(settings.max_saved, settings.max_bytes, settings.max_age_s))
        self._actions: dict[WorkerId, SlotActions] = {}
        self._discovering: dict[WorkerId, asyncio.Lock] = {}
        self._failed_at: dict[WorkerId, float] = {}
        self._saves = _Mean()
        self._restores = _Mean()
        self._freed = asyncio.Event()
        """Set (and replaced) whenever a slot is released or a save ends: wakes waiters."""
        self._flights: dict[tuple[WorkerId, int], str] = {}
        """The request each busy slot serves (``annotate``: one a new session waits for)."""
        self._writing: set[asyncio.Future[Any]] = set()
        """Saves under way (``_finished``): a cancelled request's runs on, as the worker
        writes the file anyway (at most the action timeout), and keeps its cell till then."""

    def manages(self, worker: Worker) -> bool:
        """True for a llama.cpp worker while slot offload is on."""
        return self.settings.enabled and worker.config.engine == "llamacpp"

    def annotate(self, features: RequestFeatures) -> RequestFeatures:
        """``features`` with ``restorable_blocks`` set when the session's KV can follow it,
        else ``slot_shares``: what each worker's slots would give a new session.

        A session held in a slot or saved on disk can be restored on any llama.cpp
        worker reading the shared folder, so the policy credits its prefix (all but
        the last block: the new turn) on every worker, a little below a cached one.
        A new session gets the slot sharing most of its prefix (``SlotMap.shares``): an
        idle one there, another session's saved one (a seed), or one computing it now
        (the request waits for that one: ``share_wait_s``); the policies book it so.
        """
        key, prefix = features.affinity_key, features.prefix_hashes
        if not self.settings.enabled or len(prefix) < 2:
            return features
        workers, shares = self.map.workers(), []
        if not workers:  # no llama.cpp worker known (yet)
            return features
        tier, holder = self.map.where(key) if key is not None else (KvTier.RECOMPUTE, None)
        if key is not None and self.map.saving(key):
            tier = KvTier.DISK  # its turn waits for the save, then restores it (``acquire``)
        if tier is not KvTier.SLOT and tier is not KvTier.DISK:
            for worker in workers:
                blocks, slot = self.map.shares(worker, key, prefix)
                if blocks:
                    shares.append((worker, blocks, self._flights.get((worker, slot), "")))
        found = {w: self._chars(blocks) for w, blocks, _ in shares}
        uncached = self.turns.uncached(
            key, features.prompt_chars, workers, slot=holder, saved=tier is KvTier.DISK,
            shared=lambda w: found.get(w, 0),
        )  # fmt: skip
        if shares or tier is KvTier.RECOMPUTE:
            return replace(features, slot_shares=tuple(shares), slot_uncached=uncached)
        return replace(features, restorable_blocks=len(prefix) - 1, slot_uncached=uncached)

    def _chars(self, blocks: int) -> int:
        """Characters the first ``blocks`` prefix blocks of a prompt cover."""
        cfg = self._blocks
        fine = cfg.max_blocks
        wide = blocks if blocks <= fine else fine + (blocks - fine) * cfg.coarse_factor
        return wide * cfg.block_chars

    def ended(self, features: RequestFeatures, end: AttemptEnd) -> None:
        """An attempt ended (``EndListener``): a llama.cpp turn's usage says what its
        session left in its slot (``annotate``)."""
        if end.prompt_tokens is not None and self.map.manages(end.worker):
            said = features.slot_tokens(end.worker, -1.0)[0]
            if said >= 0.0 and end.cached_tokens is not None:  # what it was told, against usage
                computed = end.prompt_tokens - end.cached_tokens
                self.turns.observed(bool(features.restorable_blocks), said, computed)
            self.turns.ended(
                features.affinity_key, end.worker, features.prompt_chars, end.prompt_tokens,
                end.completion_tokens or 0,
            )  # fmt: skip

    def move_seconds(self, key: SessionKey) -> float | None:
        """What moving ``key`` to another worker costs with its KV, or None (recompute).

        From its tier: a slot is saved then restored, a saved slot only restored;
        each at the mean this gateway measured so far.
        """
        if not self.settings.enabled:
            return None
        tier, _ = self.map.where(key)
        if tier is KvTier.SLOT:
            return self._saves.mean() + self._restores.mean()
        if tier is KvTier.DISK:
            return self._restores.mean()
        return None

    def filename(self, cell: int) -> str:
        """The file a cell's slot is saved in (relative to the slot save path)."""
        if self.claim is not None:
            return self.claim.filename(cell)
        return f"{self.settings.file_prefix}-{cell}.bin"

    async def start(self, *, wait: bool = True) -> None:
        """Claim this replica's share of the slots; ``SlotClaimError`` when none is free
        (``wait``: after one lease time, for a replica that died holding one)."""
        if self.claim is not None and self.claim.index is None:
            await self.claim.acquire(wait_s=None if wait else 0.0)

    async def stop(self) -> None:
        """Give the claim back, so a restarted replica need not wait for it to lapse."""
        if self.claim is not None:
            await self.claim.release()

    def worker_back(self, worker: Worker) -> None:
        """``worker`` is up after probes took it down: it may have restarted with empty
        slots, so they are learned again rather than trusted."""
        if self.map.manages(worker.id):
            self.map.forget_worker(worker.id)
            log.info("worker %s is back: relearning its slots", worker.id)

    def verify(
        self, key: SessionKey, worker: WorkerId, prompt_tokens: int, cached: int | None
    ) -> None:
        """A turn's usage: did the slot or restore it was promised hold its KV?

        Nothing cached where the map promised a slot or a restore means another
        writer took it or the worker restarted: counted, and the worker's slots are
        learned again (``GET /slots``) instead of trusted.
        """
        expected = self._expect.pop(key, None)
        if expected is None or cached is None or expected[0] != worker:
            return
        tier = expected[1]
        if cached > 0 or prompt_tokens <= 0:
            return
        if tier in (KvTier.DISK, KvTier.MIGRATED):
            self.metrics.restores.labels(worker, "empty").inc()
        self.metrics.fallbacks.labels(worker, "verify").inc()
        log.warning(
            "worker %s: a turn served from its %s tier had nothing cached (another writer, "
            "or the worker restarted): relearning its slots",
            worker,
            tier.value,
        )
        self.map.forget_worker(worker)

    # -- the request path ---------------------------------------------------------

    async def post(
        self,
        worker: Worker,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        key: SessionKey | None,
        *,
        prefix: Sequence[BlockHash] = (),
        tokens: int = 0,
        request_id: str = "",
    ) -> UpstreamResponse:
        """``worker.upstream.post`` under a slot lease; the lease ends with the response.
        ``prefix``: the request's prefix blocks (a new session takes the idle slot sharing
        most of them: ``SlotMap.acquire``); ``tokens``: its prompt's, about (what a wait
        for a busy slot computing the shared part may cost: ``share_wait_s``)."""
        if not await self._known(worker):
            return await worker.upstream.post(path, body, headers)
        plan = await self._acquire(worker, key, prefix, tokens)
        self._flights[(worker.id, plan.place.slot)] = request_id
        try:
            planned, started = plan.tier, self.mono()
            tier = await self._prepare(worker, plan)
            if planned is not KvTier.FALLBACK:  # what a turn so placed waits before it is sent
                moved = planned in (KvTier.DISK, KvTier.MIGRATED)
                kind = self.turns.kind(kept=planned is KvTier.SLOT or moved, here=not moved)
                self.turns.prepared(kind, self.mono() - started)
            pinned = _pin(body, plan.place.slot)
            response = await worker.upstream.post(path, pinned, headers)
        except BaseException:
            self.map.abandon(plan)  # cells and a migration source it still held
            self._release(plan, served=False)
            raise
        self.metrics.turns.labels(worker.id, tier.value).inc()
        if key is not None and tier in (KvTier.SLOT, KvTier.DISK, KvTier.MIGRATED):
            self._expect.pop(key, None)
            self._expect[key] = (worker.id, tier)
            if len(self._expect) > _EXPECT_MAX:
                self._expect.popitem(last=False)
        extra = CIMultiDict(response.headers)
        extra[TIER_HEADER] = tier.value
        response.headers = CIMultiDictProxy(extra)
        ok = response.status < 400
        response.on_release = lambda complete: self._release(plan, served=complete and ok)
        return response

    async def offload(self, worker: Worker, keys: list[SessionKey]) -> int:
        """Save these sessions' idle slots on ``worker`` to disk and free the slots.

        The pressure driver's offload for llama.cpp workers (the emulated worker's
        is ``POST /kv/offload``): the sessions were moved to other workers, which
        restore them from the shared folder. Returns how many were saved.
        """
        if not await self._known(worker):
            return 0
        saved = 0
        actions = self._actions_of(worker)
        for key in keys:
            plan = self.map.evict_idle(worker.id, key)
            if plan is None or plan.evict_cell is None:
                continue
            cell, plan.evict_cell = plan.evict_cell, None  # the save's own, on every path
            try:
                if await self._finished(self._save(worker.id, actions, plan.place.slot, key, cell)):
                    saved += 1
            finally:
                self.map.abandon(plan)
                self._release(plan, served=False)
        return saved

    async def _known(self, worker: Worker) -> bool:
        """Learn ``worker``'s slots once (``GET /slots``); False while that fails."""
        if self.map.manages(worker.id):
            return True
        if self.mono() - self._failed_at.get(worker.id, float("-inf")) < _DISCOVERY_RETRY_S:
            return False
        lock = self._discovering.setdefault(worker.id, asyncio.Lock())
        async with lock:
            if self.map.manages(worker.id):
                return True
            try:
                await self.start(wait=False)  # a worker added later: no wait on requests
                count = await self._actions_of(worker).count()
                owned = [s for s in range(count) if self.claim is None or self.claim.owns(s)]
                self.map.add_worker(worker.id, count, owned)
            except (SlotCallError, SlotClaimError, ValueError) as exc:
                self._failed_at[worker.id] = self.mono()
                log.warning("cannot pin the slots of %s, not pinning: %s", worker.id, exc)
                return False
            log.info("worker %s: %d llama.cpp slots, %d pinned here", worker.id, count, len(owned))
            return True

    def _actions_of(self, worker: Worker) -> SlotActions:
        found = self._actions.get(worker.id)
        if found is None:
            found = self._actions[worker.id] = SlotActions(
                worker.upstream, worker.config.url, self.settings.action_timeout_s
            )
        return found

    def share_wait_s(
        self, worker: Worker, key: SessionKey | None, prefix: Sequence[BlockHash], tokens: int
    ) -> float:
        """How long a request may wait for a busy slot of ``worker`` computing its prefix:
        what computing the shared part itself would take (its share of ``tokens`` at the
        worker's own prefill seconds a token, ``/metrics``), sharing the engine with the
        requests in flight there (a compute-bound engine serves them side by side: each
        more slows it as much); 0 where none shares it or the rate is unknown (no
        evidence the wait pays)."""
        shared = self.map.in_flight_share(worker.id, key, prefix)
        signals = worker.signals
        rate = signals.prefill_s_per_token if signals is not None else None
        if not shared or not rate or tokens <= 0:
            return 0.0
        alongside = 1 + self.map.busy(worker.id)
        return min(shared / len(prefix) * tokens * rate * alongside, self.wait_limit_s)

    async def _acquire(
        self,
        worker: Worker,
        key: SessionKey | None,
        prefix: Sequence[BlockHash] = (),
        tokens: int = 0,
    ) -> SlotPlan:
        """A plan with a slot of ``worker``, waiting for a release while all are busy (and,
        a bounded while, for a busy slot computing the request's prefix: ``share_wait_s``)."""
        now = self.mono()
        deadline = now + self.wait_limit_s
        share_until = now + self.share_wait_s(worker, key, prefix, tokens)
        while True:
            now = self.mono()
            self._drop_files(self.map.expire(now))
            sharing = now < share_until
            plan = self.map.acquire(worker.id, key, now, prefix, wait_share=sharing)
            if plan is not None:
                return plan
            left = (min(share_until, deadline) if sharing else deadline) - now
            if not sharing and left <= 0:
                raise UpstreamTimeout(f"no slot of {worker.id} came free in time")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), max(left, 0.0))

    def _release(self, plan: SlotPlan, *, served: bool) -> None:
        self._flights.pop((plan.place.worker, plan.place.slot), None)
        self.map.release(plan, self.mono(), served=served)
        self._export()
        self._wake()

    def _wake(self) -> None:
        """Wake requests waiting for a slot, or for their own session's save to end."""
        freed, self._freed = self._freed, asyncio.Event()
        freed.set()

    async def _prepare(self, worker: Worker, plan: SlotPlan) -> KvTier:
        """Carry out the plan's moves before the request goes out; the tier it ends with."""
        here = self._actions_of(worker)
        slot = plan.place.slot
        if plan.evict is not None and plan.evict_cell is not None:
            cell, plan.evict_cell = plan.evict_cell, None  # the save's own, on every path
            await self._finished(self._save(worker.id, here, slot, plan.evict, cell))
        tier = plan.tier
        if plan.seed is not None:
            seed, plan.seed = plan.seed, None  # the read's own, on every path
            if not await self._finished(self._seed(worker.id, here, slot, seed.cell)):
                self.metrics.fallbacks.labels(worker.id, "seed").inc()
                tier = KvTier.RECOMPUTE
        if plan.migrate_from is not None and plan.move_cell is not None and plan.key is not None:
            cell, plan.move_cell = plan.move_cell, None  # the migration's own, on every path
            tier = await self._migrate(worker, plan, plan.key, cell)
        elif plan.restore is not None:
            saved = plan.restore
            restored = await self._restore(worker.id, here, slot, saved.cell)
            self.map.release_cell(saved.cell)
            if not restored:
                self.metrics.fallbacks.labels(worker.id, "restore").inc()
                tier = KvTier.FALLBACK
        return tier

    def _finished(self, call: Awaitable[_T]) -> asyncio.Future[_T]:
        """``call`` carried to its end even when the request awaiting it is cancelled.

        A slot save is the worker's to finish once sent: were its cell freed when the
        client went away, a save of another session (here or on a worker sharing the
        folder) could take the file, and the late write would land last. Shielded, the
        save keeps its cell and reports as usual when the call returns (at most the
        action timeout later).
        """
        task: asyncio.Future[_T] = asyncio.ensure_future(call)
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)
        return asyncio.shield(task)

    async def _save(
        self, worker: WorkerId, actions: SlotActions, slot: int, key: SessionKey, cell: int
    ) -> bool:
        """Save ``slot`` into ``cell``; the one owner of the cell: reported saved or released."""
        started = self.mono()
        try:
            moved = await actions.save(slot, self.filename(cell))
        except BaseException as exc:
            self.map.release_cell(cell)
            self._wake()
            if not isinstance(exc, SlotCallError):
                raise
            self.metrics.saves.labels(worker, "error").inc()
            log.warning("saving slot %d of %s failed, its KV is dropped: %s", slot, worker, exc)
            return False
        self._saves.add(self.mono() - started)
        self.metrics.save_seconds.observe(self.mono() - started)
        self.metrics.saves.labels(worker, "ok").inc()
        self._drop_files(self.map.saved(key, cell, moved.tokens, moved.bytes, self.mono()))
        self._export()
        self._wake()  # the session, if it came back meanwhile, can now be restored
        return True

    async def _seed(self, worker: WorkerId, actions: SlotActions, slot: int, cell: int) -> bool:
        """Restore another session's saved ``cell`` into ``slot``; the cell is kept from
        reuse until the worker has read it (shielded: a cancelled request's read runs on)."""
        try:
            return await self._restore(worker, actions, slot, cell)
        finally:
            self.map.seeded(cell)
            self._wake()

    async def _restore(self, worker: WorkerId, actions: SlotActions, slot: int, cell: int) -> bool:
        started = self.mono()
        try:
            await actions.restore(slot, self.filename(cell))
        except SlotCallError as exc:
            self.metrics.restores.labels(worker, "error").inc()
            log.warning("restoring into slot %d of %s failed, recomputing: %s", slot, worker, exc)
            with contextlib.suppress(SlotCallError):
                await actions.erase(slot)
            return False
        self._restores.add(self.mono() - started)
        self.metrics.restore_seconds.observe(self.mono() - started)
        self.metrics.restores.labels(worker, "ok").inc()
        return True

    async def _migrate(self, worker: Worker, plan: SlotPlan, key: SessionKey, cell: int) -> KvTier:
        """Save ``key``'s slot on its old worker, restore it into this one's slot.

        Owns ``cell``: released when done, on every path; cancelled during the save,
        once that save has really returned (see ``_finished``)."""
        source = plan.migrate_from
        assert source is not None
        source_actions = self._actions.get(source.worker)
        ok = False
        saving: asyncio.Future[SlotTransfer] | None = None
        try:
            if source_actions is not None:
                saving = asyncio.ensure_future(
                    source_actions.save(source.slot, self.filename(cell))
                )
                try:
                    await self._finished(saving)
                    ok = True
                except SlotCallError as exc:
                    log.warning("migration save on %s failed: %s", source.worker, exc)
            self.map.moved_out(plan)
            if ok:
                ok = await self._restore(worker.id, self._actions_of(worker), plan.place.slot, cell)
        finally:
            if saving is not None and not saving.done():  # cancelled: the worker writes on
                saving.add_done_callback(lambda done: self._moved_file(cell, done))
            else:
                self._moved_file(cell, saving)
        result = "ok" if ok else "error"
        self.metrics.migrations.labels(source.worker, worker.id, result).inc()
        if not ok:
            self.metrics.fallbacks.labels(worker.id, "migrate").inc()
            return KvTier.FALLBACK
        return KvTier.MIGRATED

    # -- disk bookkeeping ---------------------------------------------------------

    def _moved_file(self, cell: int, saving: asyncio.Future[SlotTransfer] | None) -> None:
        """A migration is done with ``cell`` (its save has returned): free it, delete the file."""
        if saving is not None and not saving.cancelled():
            saving.exception()  # retrieved: a late save's failure is the migration's, logged
        self.map.release_cell(cell)
        self._drop_files([cell])
        self._wake()

    def _drop_files(self, cells: list[int]) -> None:
        """Delete files of cells no longer needed, when the gateway can see the folder.

        Without ``dir`` the files stay and are overwritten when their cell is reused,
        which bounds them just the same.
        """
        if not cells or self.settings.dir is None:
            return
        for cell in cells:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(Path(self.settings.dir) / self.filename(cell))
        self._export()

    def _export(self) -> None:
        self.metrics.saved_bytes.set(self.map.saved_bytes)
        self.metrics.saved_sessions.set(self.map.saved_count())


class _Mean:
    """A running mean of seconds, with a prior until the first measurement."""

    PRIOR_S = 0.05
    """llama.cpp's own time for a 2,300-token slot on a CPU: 41 ms to save, 16 to restore."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def add(self, seconds: float) -> None:
        self.total += seconds
        self.count += 1

    def mean(self) -> float:
        return self.total / self.count if self.count else self.PRIOR_S


def _pin(body: bytes, slot: int) -> bytes:
    """The request body with llama.cpp's ``id_slot`` set (the proxy already parsed it)."""
    payload = json.loads(body)
    payload["id_slot"] = slot
    return json.dumps(payload, separators=(",", ":")).encode()
