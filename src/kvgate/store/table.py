"""The session table behind ``MemoryStore``: a bounded LRU of affinities with TTLs.

Synchronous and clock-free (every call is given the store's time ``t``), so it can
be tested exhaustively and reused by anything that wants affinities without I/O.

Layout: one dict maps a session key to a slot number; everything else about a slot
lives in parallel typed arrays (worker and version as interned small ints, times as
doubles) and in three families of intrusive linked lists over the slots:

- recency: one list, least recently written/touched first, evicted from the head;
- per worker: one list per worker, for ``sessions_of`` and exact ``counts``;
- per expiry bucket: one list per ``granularity``-wide window of expiry times, so
  expired sessions are found without scanning the table (a timing wheel);
- per tenant (``core.session.tenant_of``: the scope a key was derived in), least recently
  written/touched first: a tenant past ``max_per_scope``, or past its even share of a full
  table, makes room from its own oldest, so one client's flood never evicts another's.

That is about 60 bytes a session on top of the key string and its dict entry,
against ~300 for an object per session with an ``OrderedDict`` and index sets.
"""

from __future__ import annotations

import heapq
import math
from array import array

from kvgate.core.decision import Affinity
from kvgate.core.session import tenant_of
from kvgate.store.links import NIL, Links
from kvgate.types import Seconds, SessionKey, WorkerId

_RECENCY = 0  # the id of the single recency list


class _Interned:
    """Strings mapped to small ints and back; grows with the distinct values seen.

    Worker ids and versions are few (a fleet's worth), so this never needs evicting.
    """

    __slots__ = ("_ids", "names")

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self.names: list[str] = []

    def id_of(self, name: str) -> int:
        """The int for ``name``, assigning the next one on first sight."""
        found = self._ids.get(name)
        if found is None:
            found = len(self.names)
            self._ids[name] = found
            self.names.append(name)
        return found

    def find(self, name: str) -> int | None:
        """The int for ``name`` if it was ever seen."""
        return self._ids.get(name)


class _Tenants:
    """Tenants mapped to small ints with their live sessions; an id is given back when
    its tenant holds none (a client can make up scopes: none may be kept for ever)."""

    __slots__ = ("_free", "_ids", "counts")

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._free: list[int] = []
        self.counts: list[int] = []

    def __len__(self) -> int:
        """Tenants holding a session."""
        return len(self._ids)

    def find(self, name: str) -> int | None:
        """The int of tenant ``name`` while it holds a session."""
        return self._ids.get(name)

    def add(self, name: str) -> int:
        """Count one more session of tenant ``name``; its int."""
        found = self._ids.get(name)
        if found is None:
            if self._free:
                found = self._free.pop()
            else:
                found = len(self.counts)
                self.counts.append(0)
            self._ids[name] = found
        self.counts[found] += 1
        return found

    def remove(self, name: str, tid: int) -> None:
        """Count one session of tenant ``name`` (int ``tid``) fewer."""
        self.counts[tid] -= 1
        if not self.counts[tid]:
            del self._ids[name]
            self._free.append(tid)

    def clear(self) -> None:
        """Forget every tenant."""
        self._ids.clear()
        self._free.clear()
        self.counts.clear()


class SessionTable:
    """Affinities keyed by session, at most ``max_sessions`` of them, each with a deadline.

    ``granularity`` is the width (seconds) of an expiry bucket: smaller buckets make
    exact ``counts`` cheaper, larger ones make the bucket heap smaller. ``max_per_scope``
    bounds one tenant's sessions (``None``: only by its share of a full table).
    """

    def __init__(
        self,
        max_sessions: int = 1_000_000,
        granularity: Seconds = 1.0,
        max_per_scope: int | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        if granularity <= 0:
            raise ValueError("granularity must be positive")
        if max_per_scope is not None and max_per_scope < 1:
            raise ValueError("max_per_scope must be at least 1")
        self.max_sessions = max_sessions
        self.max_per_scope = max_per_scope
        self._tenants = _Tenants()
        self._tenant = array("I")
        self._by_tenant = Links()
        self.evictions_total = 0
        self.expirations_total = 0
        self._granularity = granularity
        self._workers = _Interned()
        self._versions = _Interned()
        self._worker_counts: list[int] = []
        self._slot_of: dict[SessionKey, int] = {}
        self._free: list[int] = []
        self._key: list[SessionKey | None] = []
        self._worker = array("I")
        self._version = array("I")
        self._last_active = array("d")
        self._deadline = array("d")
        self._recency = Links()
        self._by_worker = Links()
        self._by_bucket = Links()
        self._bucket_heap: list[int] = []
        self._bucket_queued: set[int] = set()

    def __len__(self) -> int:
        """Sessions held, including any expired ones not yet swept."""
        return len(self._slot_of)

    # -- reads ------------------------------------------------------------------

    def get(self, key: SessionKey, t: Seconds) -> Affinity | None:
        """The live binding for ``key`` at time ``t``, or ``None``."""
        slot = self._live_slot(key, t)
        return None if slot is None else self._affinity(slot)

    def deadline(self, key: SessionKey, t: Seconds) -> Seconds | None:
        """When ``key``'s binding expires, or ``None`` if it is not live at ``t``."""
        slot = self._live_slot(key, t)
        return None if slot is None else self._deadline[slot]

    def sessions_of(self, worker: WorkerId, t: Seconds, limit: int | None = None) -> list[Affinity]:
        """Live bindings to ``worker``, least recently active first."""
        wid = self._workers.find(worker)
        if wid is None:
            return []
        self.expire(t, exact=True)
        slots = list(self._by_worker.slots(wid))
        key = self._last_active.__getitem__
        # The per-worker list is in touch order, which is nearly last_active order,
        # so the stable sort is close to linear; ties keep touch order.
        chosen = sorted(slots, key=key) if limit is None else heapq.nsmallest(limit, slots, key)
        return [self._affinity(slot) for slot in chosen]

    def counts(self, t: Seconds) -> dict[WorkerId, int]:
        """Live sessions per worker at time ``t`` (workers with none are left out)."""
        self.expire(t, exact=True)
        names = self._workers.names
        return {names[wid]: n for wid, n in enumerate(self._worker_counts) if n}

    # -- writes -----------------------------------------------------------------

    def put(self, affinity: Affinity, deadline: Seconds, t: Seconds) -> None:
        """Bind ``affinity.session_key`` as given, live until ``deadline``."""
        slot = self._live_slot(affinity.session_key, t)
        if slot is None:
            self._insert(affinity, deadline, t)
        else:
            self._update(slot, affinity, deadline)

    def compare_and_set(
        self,
        key: SessionKey,
        expected: WorkerId | None,
        affinity: Affinity,
        deadline: Seconds,
        t: Seconds,
    ) -> Affinity:
        """Write ``affinity`` if ``key`` is unbound or bound to ``expected``.

        Returns the binding in force afterwards. An absent binding matches any
        expectation: a binding that has vanished cannot be contested.
        """
        if affinity.session_key != key:
            affinity = Affinity(key, affinity.worker, affinity.version, affinity.last_active)
        slot = self._live_slot(key, t)
        if slot is None:
            self._insert(affinity, deadline, t)
            return affinity
        if self._workers.names[self._worker[slot]] != expected:
            return self._affinity(slot)
        self._update(slot, affinity, deadline)
        return affinity

    def touch(self, key: SessionKey, last_active: Seconds, deadline: Seconds, t: Seconds) -> bool:
        """Refresh a live binding's activity time and deadline; False if there is none."""
        slot = self._live_slot(key, t)
        if slot is None:
            return False
        self._last_active[slot] = last_active
        self._recency.move_to_tail(_RECENCY, slot)
        self._by_tenant.move_to_tail(self._tenant[slot], slot)
        self._by_worker.move_to_tail(self._worker[slot], slot)
        self._rebucket(slot, deadline)
        return True

    def delete(self, key: SessionKey, t: Seconds) -> bool:
        """Forget ``key``'s binding; False if there was no live one at ``t``."""
        slot = self._live_slot(key, t)
        if slot is None:
            return False
        self._drop(slot)
        return True

    def expire(self, t: Seconds, exact: bool = False) -> int:
        """Drop bindings whose deadline is at or before ``t``; returns how many.

        Whole buckets that lie in the past are always swept. With ``exact`` the
        bucket ``t`` falls in is scanned too, so counts are exact at ``t``.
        """
        current = math.floor(t / self._granularity)
        heap = self._bucket_heap
        dropped = 0
        while heap and heap[0] <= current:
            bucket = heap[0]
            if bucket == current and not exact:
                break
            slot = self._by_bucket.head(bucket)
            while slot != NIL:
                following = self._by_bucket.next[slot]
                if self._deadline[slot] <= t:
                    self._drop(slot)
                    dropped += 1
                slot = following
            if bucket in self._by_bucket:
                break  # the bucket t falls in still has live sessions
            heapq.heappop(heap)
            self._bucket_queued.discard(bucket)
        self.expirations_total += dropped
        return dropped

    def clear(self) -> None:
        """Forget every binding (interned names and counters are kept)."""
        self._slot_of.clear()
        self._free.clear()
        self._key.clear()
        for column in (
            self._worker,
            self._version,
            self._tenant,
            self._last_active,
            self._deadline,
        ):
            del column[:]
        for links in (self._recency, self._by_worker, self._by_bucket, self._by_tenant):
            links.clear()
        self._tenants.clear()
        self._bucket_heap.clear()
        self._bucket_queued.clear()
        self._worker_counts = [0] * len(self._worker_counts)

    # -- internals --------------------------------------------------------------

    def _live_slot(self, key: SessionKey, t: Seconds) -> int | None:
        slot = self._slot_of.get(key)
        if slot is not None and self._deadline[slot] <= t:
            self._drop(slot)
            self.expirations_total += 1
            return None
        return slot

    def _affinity(self, slot: int) -> Affinity:
        key = self._key[slot]
        assert key is not None
        return Affinity(
            key,
            self._workers.names[self._worker[slot]],
            self._versions.names[self._version[slot]],
            self._last_active[slot],
        )

    def _bucket(self, deadline: Seconds) -> int:
        return math.floor(deadline / self._granularity)

    def _link_bucket(self, slot: int, bucket: int) -> None:
        self._by_bucket.push(bucket, slot)
        if bucket not in self._bucket_queued:
            self._bucket_queued.add(bucket)
            heapq.heappush(self._bucket_heap, bucket)

    def _rebucket(self, slot: int, deadline: Seconds) -> None:
        old = self._bucket(self._deadline[slot])
        new = self._bucket(deadline)
        self._deadline[slot] = deadline
        if old != new:
            self._by_bucket.remove(old, slot)
            self._link_bucket(slot, new)

    def _make_room(self, tenant: str, t: Seconds) -> None:
        # Sweeping past buckets on every insert is one heap peek when there is
        # nothing to do, and keeps expired sessions from holding memory.
        self.expire(t)
        tenants = self._tenants
        cap = self.max_per_scope
        tid = tenants.find(tenant)
        while tid is not None and cap is not None and tenants.counts[tid] >= cap:
            self._drop(self._by_tenant.head(tid))  # its own oldest
            self.evictions_total += 1
            tid = tenants.find(tenant)
        while len(self._slot_of) >= self.max_sessions:
            # A full table: a tenant holding its even share or more makes room from its
            # own; any other takes the least recently used.
            tid = tenants.find(tenant)
            if tid is not None and tenants.counts[tid] * len(tenants) >= self.max_sessions:
                self._drop(self._by_tenant.head(tid))
            else:
                self._drop(self._recency.head(_RECENCY))
            self.evictions_total += 1

    def _allocate(self) -> int:
        if self._free:
            return self._free.pop()
        slot = len(self._key)
        self._key.append(None)
        self._worker.append(0)
        self._version.append(0)
        self._tenant.append(0)
        self._last_active.append(0.0)
        self._deadline.append(0.0)
        for links in (self._recency, self._by_worker, self._by_bucket, self._by_tenant):
            links.grow()
        return slot

    def _insert(self, affinity: Affinity, deadline: Seconds, t: Seconds) -> None:
        key = affinity.session_key
        tenant = tenant_of(key)
        self._make_room(tenant, t)
        slot = self._allocate()
        tid = self._tenant[slot] = self._tenants.add(tenant)
        self._by_tenant.push(tid, slot)
        wid = self._workers.id_of(affinity.worker)
        if wid == len(self._worker_counts):
            self._worker_counts.append(0)
        self._slot_of[key] = slot
        self._key[slot] = key
        self._worker[slot] = wid
        self._version[slot] = self._versions.id_of(affinity.version)
        self._last_active[slot] = affinity.last_active
        self._deadline[slot] = deadline
        self._recency.push(_RECENCY, slot)
        self._by_worker.push(wid, slot)
        self._worker_counts[wid] += 1
        self._link_bucket(slot, self._bucket(deadline))

    def _update(self, slot: int, affinity: Affinity, deadline: Seconds) -> None:
        old_wid = self._worker[slot]
        wid = self._workers.id_of(affinity.worker)
        if wid == len(self._worker_counts):
            self._worker_counts.append(0)
        if wid != old_wid:
            self._by_worker.remove(old_wid, slot)
            self._worker_counts[old_wid] -= 1
            self._by_worker.push(wid, slot)
            self._worker_counts[wid] += 1
            self._worker[slot] = wid
        else:
            self._by_worker.move_to_tail(wid, slot)
        self._version[slot] = self._versions.id_of(affinity.version)
        self._last_active[slot] = affinity.last_active
        self._recency.move_to_tail(_RECENCY, slot)
        self._by_tenant.move_to_tail(self._tenant[slot], slot)
        self._rebucket(slot, deadline)

    def _drop(self, slot: int) -> None:
        key = self._key[slot]
        assert key is not None
        del self._slot_of[key]
        self._key[slot] = None
        wid = self._worker[slot]
        self._recency.remove(_RECENCY, slot)
        tid = self._tenant[slot]
        self._by_tenant.remove(tid, slot)
        self._tenants.remove(tenant_of(key), tid)
        self._by_worker.remove(wid, slot)
        self._worker_counts[wid] -= 1
        self._by_bucket.remove(self._bucket(self._deadline[slot]), slot)
        self._free.append(slot)
