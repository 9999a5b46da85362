"""``core.slotmap``: which slot a request gets, what is saved, restored or migrated first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.core.slotmap import MAX_SLOTS, PREFIX_BLOCKS, KvTier, SlotBounds, SlotMap, SlotPlan

W1, W2 = "http://w1", "http://w2"


def _served(
    m: SlotMap, worker: str, key: str | None, now: float, prefix: tuple[int, ...] = ()
) -> SlotPlan:
    """Acquire, report every move as done (1,000 tokens, 10 bytes), release as served."""
    plan = m.acquire(worker, key, now, prefix)
    assert plan is not None
    if plan.evict is not None and plan.evict_cell is not None:
        m.saved(plan.evict, plan.evict_cell, 1000, 10, now)
    if plan.migrate_from is not None:
        m.moved_out(plan)
        assert plan.move_cell is not None
        m.release_cell(plan.move_cell)
    if plan.restore is not None:
        m.release_cell(plan.restore.cell)
    if plan.seed is not None:
        m.seeded(plan.seed.cell)
    m.release(plan, now, served=True)
    return plan


def test_returning_session_gets_its_slot_back() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 2)
    assert _served(m, W1, "a", 1).tier is KvTier.RECOMPUTE
    assert _served(m, W1, "b", 2).tier is KvTier.RECOMPUTE
    again = _served(m, W1, "a", 3)
    assert again.tier is KvTier.SLOT and again.evict is None
    assert m.holders(W1) == ["a", "b"]


def test_slot_reuse_saves_the_least_recent_holder_then_restores_it() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 2)
    _served(m, W1, "a", 1)
    _served(m, W1, "b", 2)
    c = _served(m, W1, "c", 3)
    assert c.evict == "a" and c.place.slot == 0 and c.tier is KvTier.RECOMPUTE
    assert m.where("a") == (KvTier.DISK, None)
    back = _served(m, W1, "a", 4)
    assert back.tier is KvTier.DISK and back.evict == "b"
    assert back.restore is not None and back.restore.cell == c.evict_cell
    assert m.where("a") == (KvTier.SLOT, W1) and m.where("b") == (KvTier.DISK, None)


def test_session_on_another_worker_migrates_from_its_idle_slot() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 1)
    m.add_worker(W2, 1)
    _served(m, W1, "a", 1)
    plan = m.acquire(W2, "a", 2)
    assert plan is not None and plan.tier is KvTier.MIGRATED
    assert plan.migrate_from is not None and plan.migrate_from.worker == W1
    m.moved_out(plan)
    assert m.holders(W1) == [None]
    m.release(plan, 3, served=True)
    assert m.where("a") == (KvTier.SLOT, W2)


def test_busy_source_is_not_waited_for() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 2)
    m.add_worker(W2, 1)
    _served(m, W1, "a", 1)
    held = m.acquire(W1, "a", 2)  # a turn of ``a`` is running on W1
    assert held is not None and held.tier is KvTier.SLOT
    other = m.acquire(W2, "a", 3)
    assert other is not None and other.tier is KvTier.RECOMPUTE and other.migrate_from is None


def test_all_slots_busy_means_wait() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 1)
    first = m.acquire(W1, "a", 1)
    assert first is not None
    assert m.acquire(W1, "b", 2) is None
    m.release(first, 3, served=True)
    assert m.acquire(W1, "b", 4) is not None


def test_anonymous_requests_are_never_saved() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 1)
    _served(m, W1, None, 1)
    assert m.holders(W1) == [None]
    plan = _served(m, W1, "a", 2)
    assert plan.evict is None


def test_failed_request_leaves_the_slot_unknown() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 1)
    plan = m.acquire(W1, "a", 1)
    assert plan is not None
    m.release(plan, 2, served=False)
    assert m.where("a") == (KvTier.RECOMPUTE, None)
    assert m.holders(W1) == [None]


def test_disk_tier_bounded_by_count() -> None:
    m = SlotMap(SlotBounds(max_saved=2))
    m.add_worker(W1, 1)
    for t, key in enumerate("abcd"):
        _served(m, W1, key, t)
    # a, b, c were saved in turn into two cells: a was forgotten for c.
    assert m.saved_count() == 2 and m.where("a") == (KvTier.RECOMPUTE, None)
    assert m.where("b") == m.where("c") == (KvTier.DISK, None)
    assert m.saved_bytes == 20


def test_disk_tier_bounded_by_bytes_and_age() -> None:
    m = SlotMap(SlotBounds(max_saved=5, max_bytes=25, max_age_s=100))
    assert m.saved("a", 0, 1, 10, 0) == []
    assert m.saved("b", 1, 1, 10, 50) == []
    # A third file would pass 25 bytes: the oldest is dropped, its cell returned.
    assert m.saved("c", 2, 1, 10, 60) == [0]
    assert m.saved_bytes == 20 and m.where("a") == (KvTier.RECOMPUTE, None)
    assert m.expire(120) == []
    assert m.expire(151) == [1] and m.where("c") == (KvTier.DISK, None)
    assert m.expire(1_000) == [2] and m.saved_count() == 0 and m.saved_bytes == 0


def test_abandoned_plan_gives_back_cells_and_source() -> None:
    m = SlotMap(SlotBounds(max_saved=1))
    m.add_worker(W1, 1)
    m.add_worker(W2, 1)
    _served(m, W1, "a", 1)
    plan = m.acquire(W2, "a", 2)
    assert plan is not None and plan.move_cell is not None
    m.abandon(plan)
    m.release(plan, 3, served=False)
    # The only cell is free again and W1's slot is not stuck busy.
    again = m.acquire(W1, "b", 4)
    assert again is not None and again.place.slot == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([W1, W2]),
            st.sampled_from(["a", "b", "c", "d", "e", None]),
            st.sampled_from([(), (1,), (1, 2), (1, 3), (4, 5, 6)]),
        ),
        max_size=60,
    )
)
def test_invariants_hold_on_any_sequence(
    steps: list[tuple[str, str | None, tuple[int, ...]]],
) -> None:
    """A session is in at most one place; cells are never shared; bounds always hold."""
    m = SlotMap(SlotBounds(max_saved=3, max_bytes=10_000))
    m.add_worker(W1, 2)
    m.add_worker(W2, 1)
    for t, (worker, key, prefix) in enumerate(steps):
        _served(m, worker, key, float(t), prefix)
        resident = [h for w in (W1, W2) for h in m.holders(w) if h is not None]
        assert len(resident) == len(set(resident))
        assert not set(resident) & set(m._saved)
        cells = [s.cell for s in m._saved.values()]
        assert len(cells) == len(set(cells)) and len(cells) <= 3
        assert not m._reading and not m._deferred
        assert m.saved_bytes == sum(s.bytes for s in m._saved.values()) <= 10_000
        assert not set(cells) & set(m._free_cells)


def test_a_session_being_saved_waits_for_the_save_then_restores() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 2)
    _served(m, W1, "a", 1)
    _served(m, W1, "b", 2)
    taking = m.acquire(W1, "c", 3)  # c takes a's slot: a's KV is being saved
    assert taking is not None and taking.evict == "a" and taking.evict_cell is not None
    # a comes back before the save is done: neither in a slot nor on disk yet. Without
    # the wait it would be recomputed though its KV is a moment from being on disk.
    assert m.acquire(W1, "a", 4) is None
    m.saved("a", taking.evict_cell, 1000, 10, 4)
    back = m.acquire(W1, "a", 5)
    assert back is not None and back.tier is KvTier.DISK
    # A failed save ends the wait too, with a recompute.
    m.release_cell(back.restore.cell if back.restore else -1)
    m.release(back, 6, served=True)
    m.release(taking, 6, served=True)
    again = m.acquire(W1, "d", 7)
    assert again is not None and again.evict is not None and again.evict_cell is not None
    lost = again.evict
    assert m.acquire(W1, lost, 8) is None
    m.release_cell(again.evict_cell)
    after = m.acquire(W1, lost, 9)
    assert after is not None and after.tier is KvTier.RECOMPUTE


def test_a_replica_pins_only_its_share_of_the_slots() -> None:
    slots = SlotMap(SlotBounds())
    slots.add_worker("w", 4, owned=[1, 3])
    plans = [slots.acquire("w", f"s{i}", 0.0) for i in range(3)]
    assert [p.place.slot for p in plans if p is not None] == [1, 3]
    assert plans[2] is None  # both of its slots are busy: wait, never take another's


def test_a_worker_with_no_slot_of_ours_is_refused() -> None:
    slots = SlotMap(SlotBounds())
    with pytest.raises(ValueError, match="none of the 1 slots"):
        slots.add_worker("w", 1, owned=[])
    assert not slots.manages("w")


def test_a_worker_claiming_absurdly_many_slots_is_refused() -> None:
    """A garbage ``GET /slots`` (longer than any ``--parallel``) pins nothing: the plane
    then forwards unpinned (``SlotPlane._known``)."""
    slots = SlotMap(SlotBounds())
    with pytest.raises(ValueError, match="1 to"):
        slots.add_worker("w", MAX_SLOTS + 1)
    slots.add_worker("w", MAX_SLOTS)
    assert slots.manages("w")


SYSTEM = tuple(range(100, 120))  # 20 blocks every prompt shares (a system prompt)


def test_a_new_session_takes_the_slot_sharing_its_prefix_and_saves_its_holder() -> None:
    """llama.cpp's own rule (the idle slot sharing most of the prompt), the holder saved
    first: the shared system prompt is reused in place, not computed in an empty slot."""
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 3)
    _served(m, W1, "a", 1, (*SYSTEM, 1, 2))
    b = _served(m, W1, "b", 2, (*SYSTEM, 7))
    assert b.place.slot == 0 and b.evict == "a" and b.tier is KvTier.RECOMPUTE
    assert m.where("a") == (KvTier.DISK, None) and m.holders(W1) == ["b", None, None]
    back = _served(m, W1, "a", 3, (*SYSTEM, 1, 2, 3))
    assert back.tier is KvTier.DISK and back.place.slot == 1  # restored: an empty slot


def test_the_longest_shared_prefix_wins_then_a_slot_nobody_holds_then_the_oldest() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 4)
    plans = [m.acquire(W1, key, t, (*SYSTEM, t)) for key, t in (("a", 1), ("b", 2), ("c", 3))]
    for t, plan in enumerate(plans, start=1):  # all at once: each its own slot
        assert plan is not None
        m.release(plan, t, served=True)
    assert m.holders(W1) == ["a", "b", "c", None]
    # "c"'s slot shares one block more; nobody's slot would cost no save.
    assert _served(m, W1, "d", 4, (*SYSTEM, 3, 9)).place.slot == 2
    anonymous = m.acquire(W1, None, 5, (*SYSTEM, 1))
    assert anonymous is not None and anonymous.place.slot == 0
    m.release(anonymous, 5, served=True)  # slot 0 keeps its prompt, held by nobody
    assert m.holders(W1) == [None, "b", "d", None]
    e = _served(m, W1, "e", 6, (*SYSTEM, 5))  # slots 0 and 1 share as much: 0 has no holder
    assert e.place.slot == 0 and e.evict is None
    # "c" is saved (sharing as much): restored into the empty slot, no holder saved.
    f = _served(m, W1, "f", 7, (*SYSTEM, 6))
    assert f.place.slot == 3 and f.evict is None and f.tier is KvTier.SHARED
    assert f.seed is not None and m.where("c") == (KvTier.DISK, None)
    g = _served(m, W1, "g", 8, (*SYSTEM, 7))  # "b" (2) is older than "d" (4), "e", "f"
    assert g.place.slot == 1 and g.evict == "b" and g.seed is None


def test_a_prefix_shared_too_little_takes_an_empty_slot() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 2)
    _served(m, W1, "a", 1, (1, *range(200, 220)))
    b = _served(m, W1, "b", 2, (1, *range(300, 320)))  # 1 block of 21: not above 10%
    assert b.place.slot == 1 and b.evict is None
    assert m.holders(W1) == ["a", "b"]


def test_a_failed_request_leaves_nothing_to_share() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 2)
    plan = m.acquire(W1, "a", 1, SYSTEM)
    assert plan is not None
    m.release(plan, 1, served=False)
    assert _served(m, W1, "b", 2, SYSTEM).place.slot == 0  # empty slots: the first
    assert _served(m, W1, "c", 3, SYSTEM).evict == "b"  # b's prompt is known


def test_a_slot_keeps_a_bounded_prefix() -> None:
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 1)
    plan = _served(m, W1, "a", 1, tuple(range(5 * PREFIX_BLOCKS)))
    assert len(plan.prefix) == PREFIX_BLOCKS


def test_a_short_prompt_sharing_a_long_conversations_opening_does_not_save_it() -> None:
    """A one-block prompt matching the first block of an idle 100-block conversation
    (any client can send one) would have had that conversation saved to disk and later
    restored, though an empty slot was free: a held slot needs the share of its own
    prompt too, so the KV saved is at most ten times the prefix reused."""
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 2)
    _served(m, W1, "a", 1, (*SYSTEM, *range(500, 580)))
    for t, key in enumerate((None, "x"), start=2):
        probe = _served(m, W1, key, float(t), SYSTEM[:1])
        assert probe.evict is None and probe.place.slot == 1
    assert m.holders(W1) == ["a", "x"] and m.where("a")[0] is KvTier.SLOT
    # A new session sharing the whole system prompt (20 of 100 blocks) still takes it.
    b = _served(m, W1, "b", 5, (*SYSTEM, 9))
    assert b.place.slot == 0 and b.evict == "a"


def test_a_holder_longer_than_the_kept_prefix_is_judged_by_its_whole_prompt() -> None:
    """The slot keeps ``PREFIX_BLOCKS`` blocks of its prompt, but the KV a save writes is
    all of it: a 5,120-block conversation sharing its first 200 blocks (20% of the kept
    prefix, 4% of the prompt) is not saved for them — an empty slot is free."""
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 2)
    _served(m, W1, "a", 1, tuple(range(5 * PREFIX_BLOCKS)))
    b = _served(m, W1, "b", 2, (*range(200), -1))
    assert b.evict is None and b.place.slot == 1
    assert m.where("a")[0] is KvTier.SLOT
    # Sharing more than a tenth of the whole prompt (all the kept blocks) still takes it.
    c = _served(m, W1, "c", 3, (*range(2 * PREFIX_BLOCKS), -2))
    assert c.place.slot == 0 and c.evict == "a"


def test_a_new_session_seeds_an_empty_slot_from_a_saved_slot_sharing_its_prefix() -> None:
    """Another session's saved slot holding the shared system prompt is restored into an
    empty slot, on any worker reading the folder: the prompt is read back, not computed
    (llama.cpp: 950 tokens restored in 0.06 s, where computing them took 20 s)."""
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 1)
    m.add_worker(W2, 2)
    _served(m, W1, "a", 1, (*SYSTEM, 1))
    taking = _served(m, W1, "b", 2, (*SYSTEM, 2))
    assert taking.evict == "a" and m.where("a") == (KvTier.DISK, None)
    c = m.acquire(W2, "c", 3, (*SYSTEM, 3))
    assert c is not None and c.tier is KvTier.SHARED and c.evict is None
    assert c.seed is not None and c.seed.cell == taking.evict_cell
    assert m.where("a") == (KvTier.DISK, None)  # a's file stays a's
    m.seeded(c.seed.cell)
    m.release(c, 4, served=True)
    # Too little shared (1 block of 21) seeds nothing; a returning session restores its own.
    d = _served(m, W2, "d", 5, (SYSTEM[0], *range(300, 320)))
    assert d.tier is KvTier.RECOMPUTE and d.seed is None
    back = _served(m, W1, "a", 6, (*SYSTEM, 1, 9))
    assert back.tier is KvTier.DISK and back.seed is None


def test_a_cell_read_as_a_seed_is_not_written_until_the_read_ends() -> None:
    m = SlotMap(SlotBounds(max_saved=1))
    m.add_worker(W1, 1)
    m.add_worker(W2, 2)
    _served(m, W1, "a", 1, (*SYSTEM, 1))
    _served(m, W1, "b", 2, (*SYSTEM, 2))  # a saved in the one cell
    seeding = m.acquire(W2, "c", 3, (*SYSTEM, 3))
    assert seeding is not None and seeding.seed is not None
    # b's slot is taken meanwhile: its save needs a cell, and the only one is being read.
    other = m.acquire(W1, "d", 4, tuple(range(500, 520)))
    assert other is not None and other.evict == "b" and other.evict_cell is None
    assert m.where("a")[0] is KvTier.RECOMPUTE and m._free_cells == []
    cell, seeding.seed = seeding.seed.cell, None  # the driver's read owns it (offload)
    m.seeded(cell)  # read: the cell is free again
    assert m._free_cells == [cell]
    m.abandon(seeding)  # nothing left to give back
    assert m._free_cells == [cell] and not m._reading

    # A plan cut short before its read gives the seed back itself.
    n = SlotMap(SlotBounds())
    n.add_worker(W1, 1)
    n.add_worker(W2, 1)
    _served(n, W1, "a", 1, (*SYSTEM, 1))
    _served(n, W1, "b", 2, (*SYSTEM, 2))
    cut = n.acquire(W2, "c", 3, (*SYSTEM, 3))
    assert cut is not None and cut.seed is not None and n._reading
    n.abandon(cut)
    assert cut.seed is None and not n._reading


def test_a_new_session_waits_for_the_busy_slot_computing_its_prefix() -> None:
    """Sessions arriving together: the second would compute the shared system prompt
    again in an empty slot; with ``wait_share`` it waits for the slot computing it."""
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 2)
    first = m.acquire(W1, "a", 1, (*SYSTEM, 1))
    assert first is not None
    assert m.in_flight_share(W1, "b", (*SYSTEM, 2)) == len(SYSTEM)
    assert m.acquire(W1, "b", 2, (*SYSTEM, 2), wait_share=True) is None
    assert m.in_flight_share(W2, "b", (*SYSTEM, 2)) == 0  # another worker's slots
    assert m.in_flight_share(W1, "b", (SYSTEM[0], *range(300, 320))) == 0  # too little
    m.release(first, 3, served=True)
    second = m.acquire(W1, "b", 3, (*SYSTEM, 2), wait_share=True)
    assert second is not None and second.place.slot == 0 and second.evict == "a"
    # Past its bound (the caller's), it takes an empty slot and computes the prefix.
    third = m.acquire(W1, "c", 4, (*SYSTEM, 3), wait_share=False)
    assert third is not None and third.place.slot == 1 and third.tier is KvTier.RECOMPUTE
    # A session whose own KV is saved or in a slot never waits for another's.
    assert m.in_flight_share(W1, "a", (*SYSTEM, 1, 5)) == 0


def test_shares_say_what_a_new_session_would_find_on_each_worker() -> None:
    """What ``acquire`` would give a new session of its prefix, per worker, for the policy
    to book (``SlotPlane.annotate``): a busy slot computing it (and which: it waits for
    it), then in place in the idle slot, then a seed on any worker."""
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 2)
    m.add_worker(W2, 2)
    computing = m.acquire(W1, "a", 1, (*SYSTEM, 1))
    assert computing is not None
    assert m.shares(W1, "b", (*SYSTEM, 2)) == (len(SYSTEM), computing.place.slot)
    assert m.shares(W2, "b", (*SYSTEM, 2)) == (0, -1)  # nothing there, nothing saved
    assert m.shares(W1, "b", tuple(range(300, 320))) == (0, -1)  # another prefix
    m.release(computing, 2, served=True)
    assert m.shares(W1, "b", (*SYSTEM, 2)) == (len(SYSTEM), -1)  # idle: in place
    _served(m, W1, "b", 3, (*SYSTEM, 2))
    _served(m, W1, "c", 4, (*SYSTEM, 3))  # a's slot taken: a saved
    assert m.where("a") == (KvTier.DISK, None)
    assert m.shares(W2, "d", (*SYSTEM, 4)) == (len(SYSTEM), -1)  # a's file seeds it
    assert m.shares(W1, "a", (*SYSTEM, 1, 5)) == (0, -1)  # its own KV: restorable


def test_a_session_being_saved_is_known_to_be() -> None:
    """Its slot taken by another session: its KV is on its way to disk (``saving``) until
    the save is reported, then on disk; its next turn waits for it and restores it."""
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 1)
    first = m.acquire(W1, "a", 0, (*SYSTEM, 1))
    assert first is not None
    m.release(first, 1, served=True)
    taking = m.acquire(W1, "b", 2, tuple(range(500, 520)))
    assert taking is not None and taking.evict == "a" and taking.evict_cell is not None
    assert m.saving("a") and not m.saving("b")
    m.saved("a", taking.evict_cell, 100, 1_000, 3)
    assert not m.saving("a") and m.where("a") == (KvTier.DISK, None)


def test_a_new_session_on_a_worker_whose_slots_are_all_busy_finds_what_they_share() -> None:
    """Every slot busy: it waits for one, and takes the one sharing most of its prefix once
    free; told it finds nothing, it was booked at its whole prompt (1,038 tokens, 58
    computed: real_engine.py --rate 0.4 --seed 2)."""
    m = SlotMap(SlotBounds())
    m.add_worker(W1, 2)
    first = m.acquire(W1, "a", 1, (*SYSTEM, 1))
    other = m.acquire(W1, "b", 2, tuple(range(300, 320)))
    assert first is not None and other is not None
    assert m.shares(W1, "c", (*SYSTEM, 3)) == (len(SYSTEM), -1)  # any slot, once free
    assert m.shares(W1, "c", tuple(range(600, 620))) == (0, -1)
