"""Which llama.cpp slot holds which session, and which sessions wait on disk.

A llama.cpp worker has a fixed number of slots; each keeps the KV of the last
prompt it served. The gateway pins every request it sends to such a worker to
one slot (llama.cpp's ``id_slot`` request field), so it knows at all times
whose KV each slot holds. That turns the slot API into real actions:

- **offload**: before a slot is given to another session, its idle holder's KV
  is saved to a file (``POST /slots/{id}?action=save``);
- **restore**: a session that comes back while its KV is on disk is restored
  into the slot it is given (``?action=restore``) before its turn is sent;
- **migrate**: a session placed on another worker than the one whose slot holds
  it is saved there and restored here (both workers read the same folder).

A request that holds no slot gets the idle slot whose last prompt shares the most
of its prefix, as llama.cpp itself picks one (``--slot-prompt-similarity``: more than
``SIMILARITY`` of the prompt): one nobody holds as it is; else, where another session's
saved slot shares as much, that file is restored into an empty slot first (**seed**: the
shared prefix is read back, ~0.06 s for 950 tokens on a CPU, where computing it took
20 s, and on any worker reading the folder); else the idle slot's holder is saved first
and the prefix reused in place. Where none shares it but a busy slot of the worker is
computing it right now, the request may wait for that slot (``acquire``'s
``wait_share``: the caller bounds the wait, ``in_flight_share``), so a prefix that
sessions arriving together share is computed once per worker, not once per slot.
Without any of these it gets an empty slot, else the least recently used.

This module only decides; ``gateway.control.offload`` carries the plan out and
reports back. Saved slots live in a bounded set of **cells** (file names reused
in turn), bounded by count, bytes and age, so the disk tier can never grow
without limit even when the gateway cannot delete files itself.

Pure and synchronous: times are passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from kvgate.core.chain import shared_blocks
from kvgate.types import BlockHash, Seconds, SessionKey, WorkerId

SIMILARITY = 0.1
"""The share of a request's prefix blocks an idle slot's last prompt must hold for the
request to take that slot over an empty one (llama.cpp's ``--slot-prompt-similarity``);
a slot someone holds, of the holder's last prompt too (its KV is saved first)."""
MAX_SLOTS = 1024
"""The most slots a worker is believed to have: llama.cpp's ``--parallel`` is in the tens;
a longer ``GET /slots`` list is garbage, not a model of the engine (each request scans them)."""
PREFIX_BLOCKS = 1024
"""Prefix blocks kept per slot (a bound: past them two prompts count as alike)."""


class KvTier(StrEnum):
    """Where a session's KV came from for one turn (a metric label and a header)."""

    SLOT = "slot"
    """Still in the slot it was last served from."""
    DISK = "disk"
    """Restored from a saved slot file on the same or another worker."""
    MIGRATED = "migrated"
    """Saved from another worker's slot and restored here, for this turn."""
    RECOMPUTE = "recompute"
    """Nothing known: the prompt is computed (new or forgotten session)."""
    SHARED = "shared"
    """A new session whose shared prefix was restored from another session's saved slot."""
    FALLBACK = "fallback"
    """A restore or migration failed; the prompt is recomputed instead."""


@dataclass(frozen=True, slots=True)
class SlotBounds:
    """How much the disk tier may hold: cells (files), bytes and age."""

    max_saved: int = 64
    max_bytes: int = 4 * 1024**3
    max_age_s: Seconds = 3600.0

    def __post_init__(self) -> None:
        if self.max_saved < 1 or self.max_bytes < 1 or self.max_age_s <= 0:
            raise ValueError("slot bounds must be positive")


@dataclass(slots=True)
class Slot:
    """One slot of one worker: whose KV it holds and whether a request uses it."""

    holder: SessionKey | None = None
    last_used: Seconds = float("-inf")
    busy: bool = False
    prefix: tuple[BlockHash, ...] = ()
    """The prefix blocks of the last prompt served here (its KV stays in the slot when the
    holder is saved away); empty when unknown."""
    blocks: int = 0
    """How many blocks that prompt had: ``prefix`` keeps at most ``PREFIX_BLOCKS``, and a
    share of the holder's prompt is a share of all of it."""
    flight: tuple[BlockHash, ...] = ()
    """While busy: the prefix blocks of the prompt it is serving (what it will hold)."""
    flight_blocks: int = 0


@dataclass(frozen=True, slots=True)
class Saved:
    """One session's KV saved in a cell."""

    cell: int
    tokens: int
    bytes: int
    saved_at: Seconds
    prefix: tuple[BlockHash, ...] = ()
    """The prefix blocks of the prompt saved (what another session may share: ``seed``)."""
    blocks: int = 0


@dataclass(frozen=True, slots=True)
class Place:
    """A slot on a worker."""

    worker: WorkerId
    slot: int


@dataclass(slots=True)
class SlotPlan:
    """What to do before a request is sent: the slot it gets and the KV moves first.

    ``evict`` is the slot's previous holder, to be saved into ``evict_cell``;
    ``migrate_from`` is a slot of another worker holding the session, to be saved
    into ``move_cell`` and restored here; ``restore`` is a cell to
    restore into the slot. The driver reports each step back.
    """

    key: SessionKey | None
    place: Place
    tier: KvTier
    evict: SessionKey | None = None
    evict_cell: int | None = None
    migrate_from: Place | None = None
    move_cell: int | None = None
    restore: Saved | None = None
    source_held: bool = False
    """The migration source's slot is still marked busy for this plan."""
    seed: Saved | None = None
    """Another session's saved slot sharing this request's prefix, to restore into the
    slot first; its cell is kept from reuse until ``seeded``."""
    prefix: tuple[BlockHash, ...] = ()
    """The request's prefix blocks (at most ``PREFIX_BLOCKS``): what the slot holds once
    it is served."""
    blocks: int = 0
    """How many prefix blocks the request has (``prefix`` is cut at ``PREFIX_BLOCKS``)."""


class SlotMap:
    """The slot holders of every managed worker and the saved sessions (bounded)."""

    def __init__(self, bounds: SlotBounds) -> None:
        self.bounds = bounds
        self._slots: dict[WorkerId, list[Slot]] = {}
        self._resident: dict[SessionKey, Place] = {}
        self._saved: OrderedDict[SessionKey, Saved] = OrderedDict()
        self._free_cells: list[int] = list(range(bounds.max_saved - 1, -1, -1))
        self._pending_cells: set[int] = set()
        self._saving: dict[SessionKey, int] = {}
        """Sessions whose slot is being saved right now, and the cell it goes to."""
        self._kept: dict[SessionKey, tuple[tuple[BlockHash, ...], int]] = {}
        """The prefix (and its length in blocks) of each slot being saved."""
        self._reading: dict[int, int] = {}
        """Cells being restored as another session's seed, and by how many restores: not
        reused (written) until they end; one dropped meanwhile is freed then."""
        self._deferred: set[int] = set()
        self.saved_bytes = 0
        self._owned: dict[WorkerId, list[int]] = {}

    # -- workers ------------------------------------------------------------------

    def add_worker(self, worker: WorkerId, slots: int, owned: Sequence[int] | None = None) -> None:
        """Manage ``worker`` with ``slots`` slots (all empty: their KV is unknown).

        ``owned``: the slots this gateway may pin (its replica's share); the others
        are left to the replicas that own them. Default: all.
        """
        if not 1 <= slots <= MAX_SLOTS:
            raise ValueError(f"a worker has 1 to {MAX_SLOTS} slots, not {slots}")
        mine = list(range(slots)) if owned is None else [i for i in owned if 0 <= i < slots]
        if not mine:
            raise ValueError(f"none of the {slots} slots of {worker} is this gateway's to pin")
        self._slots[worker] = [Slot() for _ in range(slots)]
        self._owned[worker] = mine

    def manages(self, worker: WorkerId) -> bool:
        """True once ``worker``'s slots are known."""
        return worker in self._slots

    def forget_worker(self, worker: WorkerId) -> None:
        """``worker`` restarted or left: its slots' KV is gone (saved files stay)."""
        self._owned.pop(worker, None)
        for slot in self._slots.pop(worker, []):
            if slot.holder is not None:
                self._resident.pop(slot.holder, None)

    # -- queries ------------------------------------------------------------------

    def where(self, key: SessionKey) -> tuple[KvTier, WorkerId | None]:
        """Where ``key``'s KV is: in a slot (and whose), on disk, or nowhere known."""
        place = self._resident.get(key)
        if place is not None:
            return KvTier.SLOT, place.worker
        if key in self._saved:
            return KvTier.DISK, None
        return KvTier.RECOMPUTE, None

    def saving(self, key: SessionKey) -> bool:
        """Whether ``key``'s KV is being saved now (restorable once written: ``acquire``)."""
        return key in self._saving

    def busy(self, worker: WorkerId) -> int:
        """How many of this gateway's slots of ``worker`` serve a request now."""
        slots = self._slots.get(worker, [])
        return sum(slots[i].busy for i in self._owned.get(worker, []))

    def saved_count(self) -> int:
        """How many sessions are saved on disk."""
        return len(self._saved)

    def holders(self, worker: WorkerId) -> list[SessionKey | None]:
        """Each slot's holder on ``worker`` (tests, admin)."""
        return [s.holder for s in self._slots.get(worker, [])]

    # -- the plan -----------------------------------------------------------------

    def acquire(
        self,
        worker: WorkerId,
        key: SessionKey | None,
        now: Seconds,
        prefix: Sequence[BlockHash] = (),
        *,
        wait_share: bool = False,
    ) -> SlotPlan | None:
        """Give the request a free slot of ``worker`` and say what must move first.

        None when every slot is busy, or while ``key``'s own slot is being saved
        (its KV is neither in a slot nor on disk yet): the caller waits for a
        release or for the save to end, then asks again. Prefers the slot that
        holds ``key``, then the idle slot sharing most of ``prefix`` (the request's
        prefix blocks; more than ``SIMILARITY`` of them) or a saved slot sharing it
        (``seed``), then an empty one, then the least recently used. With
        ``wait_share``, None too where only a busy slot of ``worker`` shares it
        (``in_flight_share``): the caller waits for that slot, bounded.
        """
        if key is not None and key in self._saving:
            return None
        slots = self._slots[worker]
        blocks = tuple(prefix[:PREFIX_BLOCKS])
        chosen = self._choose(worker, slots, key, blocks, length=len(prefix), wait_share=wait_share)
        if chosen is None:
            return None
        index, seed = chosen
        slot = slots[index]
        slot.busy = True
        slot.flight, slot.flight_blocks = blocks, len(prefix)
        plan = SlotPlan(
            key, Place(worker, index), KvTier.RECOMPUTE, prefix=blocks, blocks=len(prefix)
        )
        if seed is not None:
            plan.seed = seed
            plan.tier = KvTier.SHARED
            self._reading[seed.cell] = self._reading.get(seed.cell, 0) + 1
        if key is not None and slot.holder == key:
            plan.tier = KvTier.SLOT
            return plan
        if slot.holder is not None:
            # The idle holder's KV goes to disk instead of being overwritten.
            plan.evict = slot.holder
            self._resident.pop(slot.holder, None)
            plan.evict_cell = self._take_cell()
            if plan.evict_cell is not None:
                self._saving[slot.holder] = plan.evict_cell
                self._kept[slot.holder] = (slot.prefix, slot.blocks)
            slot.holder = None
        if key is None:
            return plan
        elsewhere = self._resident.get(key)
        if elsewhere is not None:
            source = self._slots[elsewhere.worker][elsewhere.slot]
            cell = None if source.busy else self._take_cell()
            if cell is not None:
                source.busy = True
                plan.migrate_from = elsewhere
                plan.source_held = True
                plan.move_cell = cell
                plan.tier = KvTier.MIGRATED
            # A busy source serves this session right now: recompute rather than wait.
            return plan
        saved = self._saved.pop(key, None)
        if saved is not None:
            self.saved_bytes -= saved.bytes
            self._pending_cells.add(saved.cell)
            plan.restore = saved
            plan.tier = KvTier.DISK
        return plan

    def evict_idle(self, worker: WorkerId, key: SessionKey) -> SlotPlan | None:
        """Plan saving ``key``'s idle slot on ``worker`` to disk and freeing the slot.

        The pressure driver's offload: the session was moved away, and its next turn
        restores from disk wherever it lands. None when ``key`` holds no idle slot
        there, or no cell is free.
        """
        place = self._resident.get(key)
        if place is None or place.worker != worker:
            return None
        slot = self._slots[worker][place.slot]
        if slot.busy:
            return None
        cell = self._take_cell()
        if cell is None:
            return None
        slot.busy = True
        slot.holder = None
        del self._resident[key]
        self._saving[key] = cell
        self._kept[key] = (slot.prefix, slot.blocks)
        return SlotPlan(None, place, KvTier.DISK, evict=key, evict_cell=cell)

    def _choose(
        self,
        worker: WorkerId,
        slots: list[Slot],
        key: SessionKey | None,
        prefix: tuple[BlockHash, ...],
        *,
        length: int,
        wait_share: bool,
    ) -> tuple[int, Saved | None] | None:
        if key is not None:
            place = self._resident.get(key)
            if place is not None and place.worker == worker and not slots[place.slot].busy:
                return place.slot, None
        idle = [i for i in self._owned[worker] if not slots[i].busy]
        if not idle:
            return None
        moving = key is not None and (key in self._resident or key in self._saved)
        if prefix and not moving:  # KV restored or migrated replaces what the slot held
            # A held slot (a saved one) also needs the share of its own prompt (all of
            # it, not the kept blocks): else a prompt of a block or two would have a long
            # conversation's KV saved (and restored).
            least = SIMILARITY * length
            shares = {
                i: n
                for i in idle
                if (n := shared_blocks(slots[i].prefix, prefix)) > least
                and (slots[i].holder is None or n > SIMILARITY * slots[i].blocks)
            }
            best = max(shares.values(), default=0)
            free = max((n for i, n in shares.items() if slots[i].holder is None), default=0)
            if best > free and any(slots[i].holder is None for i in idle):
                # A saved slot sharing as much is restored into an empty one rather than
                # a holder saved: one read, and the holder keeps its slot.
                seed = self._seed(prefix, least, best)
                if seed is not None:
                    return self._vacant(slots, idle), seed
            if best > 0:
                # The engine's own rule, its holder saved first; among equals, a slot
                # nobody holds (nothing to save), then the least recently used.
                alike = [i for i in shares if shares[i] == best]
                index = min(alike, key=lambda i: (slots[i].holder is not None, slots[i].last_used))
                return index, None
            seed = self._seed(prefix, least, 1)  # read back: far cheaper than computed
            if seed is not None:
                return self._vacant(slots, idle), seed
            if wait_share and self.in_flight_share(worker, key, prefix, length):
                return None  # a busy slot is computing it: the caller waits for it
        return self._vacant(slots, idle), None

    @staticmethod
    def _vacant(slots: list[Slot], idle: list[int]) -> int:
        """An empty idle slot, else the least recently used (its holder saved first)."""
        for i in idle:
            if slots[i].holder is None:
                return i
        return min(idle, key=lambda i: slots[i].last_used)

    def _seed(self, prefix: tuple[BlockHash, ...], least: float, at_least: int) -> Saved | None:
        """The saved slot sharing most of ``prefix`` (over ``least`` blocks and a tenth of
        its own prompt, at least ``at_least`` blocks), the most recent among equals."""
        found, most = None, max(at_least - 1, 0)
        for saved in self._saved.values():
            n = shared_blocks(saved.prefix, prefix)
            if n > least and n > SIMILARITY * saved.blocks and n >= most:
                found, most = saved, n
        return found if found is not None and most >= at_least else None

    def in_flight_share(
        self,
        worker: WorkerId,
        key: SessionKey | None,
        prefix: Sequence[BlockHash],
        length: int | None = None,
    ) -> int:
        """Blocks of ``prefix`` a busy slot of ``worker`` is computing (or holds) now, as
        a slot it would take once idle (0: none, or ``key``'s own KV is elsewhere)."""
        if not prefix or (
            key is not None and (key in self._resident or key in self._saved or key in self._saving)
        ):
            return 0
        least = SIMILARITY * (len(prefix) if length is None else length)
        return self._computing(worker, tuple(prefix[:PREFIX_BLOCKS]), least)[0]

    def _computing(
        self, worker: WorkerId, blocks: tuple[BlockHash, ...], least: float
    ) -> tuple[int, int]:
        """The most of ``blocks`` a busy slot of ``worker`` is computing, and that slot."""
        best, at, slots = 0, -1, self._slots.get(worker, [])
        for i in self._owned.get(worker, []):
            slot = slots[i]
            if not (slot.busy and slot.flight):
                continue
            n = shared_blocks(slot.flight, blocks)
            if n > least and n > SIMILARITY * slot.flight_blocks and n > best:
                best, at = n, i
        return best, at

    def workers(self) -> list[WorkerId]:
        """The workers whose slots are known."""
        return list(self._slots)

    def shares(
        self, worker: WorkerId, key: SessionKey | None, prefix: Sequence[BlockHash]
    ) -> tuple[int, int]:
        """What ``acquire`` would find of ``prefix`` for a new session on ``worker``: the
        blocks an idle slot there (in place) or a saved one (``seed``) shares, else those a
        busy slot is computing (``in_flight_share``: it waits for it), and that slot (-1:
        none to wait for; all busy: it waits for any, and takes the one sharing most);
        (0, -1) for a session whose own KV is somewhere."""
        if (
            not prefix
            or worker not in self._slots
            or (
                key is not None
                and (key in self._resident or key in self._saved or key in self._saving)
            )
        ):
            return 0, -1
        blocks, least = tuple(prefix[:PREFIX_BLOCKS]), SIMILARITY * len(prefix)
        slots, idle = self._slots[worker], 0
        for i in self._owned[worker]:
            slot = slots[i]
            if not slot.busy and (n := shared_blocks(slot.prefix, blocks)) > max(least, idle):
                idle = n if slot.holder is None or n > SIMILARITY * slot.blocks else idle
        seed = self._seed(blocks, least, 1)
        found = max(idle, shared_blocks(seed.prefix, blocks) if seed is not None else 0)
        if not found and all(slots[i].busy for i in self._owned[worker]):
            # It waits for a slot: the one sharing most of it, once free (``acquire``).
            found = self._computing(worker, blocks, least)[0]
        return (found, -1) if found else self._computing(worker, blocks, least)

    def _take_cell(self) -> int | None:
        """A cell to save into; None when all are being written or read right now."""
        while not self._free_cells:
            if not self._saved:
                return None
            # Every cell is taken: the oldest saved session is forgotten, its cell reused
            # (once no restore reads it: ``_free``).
            self._drop(next(iter(self._saved)))
        cell = self._free_cells.pop()
        self._pending_cells.add(cell)
        return cell

    def _drop(self, key: SessionKey) -> int:
        saved = self._saved.pop(key)
        self.saved_bytes -= saved.bytes
        self._free(saved.cell)
        return saved.cell

    def _free(self, cell: int) -> None:
        """``cell`` may be written again: now, or once the seeds reading it are done."""
        if self._reading.get(cell):
            self._deferred.add(cell)
        else:
            self._free_cells.append(cell)

    def seeded(self, cell: int) -> None:
        """A seed's restore from ``cell`` is over (done or failed): it may be reused."""
        left = self._reading.get(cell, 0) - 1
        if left > 0:
            self._reading[cell] = left
            return
        self._reading.pop(cell, None)
        if cell in self._deferred:
            self._deferred.discard(cell)
            self._free_cells.append(cell)

    # -- reports from the driver --------------------------------------------------

    def saved(self, key: SessionKey, cell: int, tokens: int, size: int, now: Seconds) -> list[int]:
        """``key``'s KV is in ``cell`` (``size`` bytes); cells dropped to stay in bounds."""
        self._pending_cells.discard(cell)
        kept: tuple[tuple[BlockHash, ...], int] = ((), 0)
        if self._saving.get(key) == cell:
            del self._saving[key]
            kept = self._kept.pop(key, kept)
        if key in self._saved:
            self._drop(key)
        self._saved[key] = Saved(cell, tokens, size, now, *kept)
        self.saved_bytes += size
        dropped: list[int] = []
        while self.saved_bytes > self.bounds.max_bytes and len(self._saved) > 1:
            dropped.append(self._drop(next(iter(self._saved))))
        return dropped

    def release_cell(self, cell: int) -> None:
        """``cell`` is no longer needed (a failed save, or its KV was restored)."""
        for key, saving in list(self._saving.items()):
            if saving == cell:  # the save failed: that session's KV is gone
                del self._saving[key]
                self._kept.pop(key, None)
        if cell in self._pending_cells:
            self._pending_cells.discard(cell)
            self._free(cell)

    def moved_out(self, plan: SlotPlan) -> None:
        """The migration source's slot was saved (or failed): it holds nobody now, and is free."""
        place = plan.migrate_from
        if place is None or not plan.source_held:
            return
        plan.source_held = False
        slots = self._slots.get(place.worker)
        if slots is None:
            return
        slot = slots[place.slot]
        if slot.holder is not None:
            self._resident.pop(slot.holder, None)
        slot.holder = None
        slot.busy = False

    def abandon(self, plan: SlotPlan) -> None:
        """The plan was cut short (an error, a cancelled request): give back what it held."""
        for cell in (plan.evict_cell, plan.move_cell):
            if cell is not None:
                self.release_cell(cell)
        if plan.seed is not None:
            self.seeded(plan.seed.cell)
            plan.seed = None
        if plan.restore is not None:
            self.release_cell(plan.restore.cell)
        self.moved_out(plan)

    def release(self, plan: SlotPlan, now: Seconds, *, served: bool) -> None:
        """The request is over: its session holds the slot (``served``), or nobody does."""
        slots = self._slots.get(plan.place.worker)
        if slots is None:
            return  # the worker was forgotten meanwhile
        slot = slots[plan.place.slot]
        slot.busy = False
        slot.flight, slot.flight_blocks = (), 0
        slot.last_used = now
        key = plan.key
        if served and key is not None:
            old = self._resident.get(key)
            if old is not None and old != plan.place:
                other = self._slots.get(old.worker)
                if other is not None and other[old.slot].holder == key:
                    other[old.slot].holder = None
            slot.holder = key
            slot.prefix = plan.prefix
            slot.blocks = plan.blocks
            self._resident[key] = plan.place
            stale = self._saved.pop(key, None)
            if stale is not None:
                # A newer turn is in a slot; the older copy on disk is of no use.
                self.saved_bytes -= stale.bytes
                self._free(stale.cell)
        else:
            if slot.holder is not None:
                self._resident.pop(slot.holder, None)
            slot.holder = None
            # Served without a session (its prompt is in the slot), or failed: unknown.
            slot.prefix = plan.prefix if served else ()
            slot.blocks = plan.blocks if served else 0

    def expire(self, now: Seconds) -> list[int]:
        """Forget sessions saved longer than ``max_age_s`` ago; their cells."""
        dropped: list[int] = []
        limit = now - self.bounds.max_age_s
        while self._saved:
            key, saved = next(iter(self._saved.items()))
            if saved.saved_at > limit:
                break
            dropped.append(self._drop(key))
        return dropped
