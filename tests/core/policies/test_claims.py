"""ClaimShares: the share of unverified cache claims counted, learned from usage reports."""

from __future__ import annotations

import pytest

from kvgate.core.policies.caches import exact_matches
from kvgate.core.policies.claims import ClaimShares
from kvgate.core.policies.running import RunningBlocks
from kvgate.core.policy import Resident
from kvgate.types import WorkerId


@pytest.mark.parametrize(
    ("past", "resident", "claimed", "expected"),
    [
        (0.0, 1_000, 5_000, 1_000),  # nothing vouched past the resident cache counts
        (0.5, 1_000, 5_000, 3_000),
        (1.0, 1_000, 5_000, 5_000),
        (0.5, 5_000, 5_000, 5_000),  # all of it resident: no gap to discount
        (0.5, 0, 0, 0),
    ],
)
def test_expected_cache_is_the_resident_part_and_the_trusted_share_of_the_rest(
    past: float, resident: int, claimed: int, expected: float
) -> None:
    shares = ClaimShares()
    shares.past = past
    assert shares.expected(resident, resident, claimed) == pytest.approx(expected)


# One placement on "a" with 1,000 characters resident and 5,000 claimed (4 characters
# a token); the worker then reports ``cached_tokens``. The share moves a tenth of the way
# toward the share of the 4,000-character gap that was there.
@pytest.mark.parametrize(
    ("start", "cached_tokens", "after"),
    [
        (0.0, 1_250, 0.1),  # the whole claim hit
        (0.0, 750, 0.05),  # half of the gap
        (1.0, 250, 0.9),  # only the resident part: the claim was stale
        (1.0, 0, 0.9),  # less than resident counts as none of the gap, not less
    ],
)
def test_usage_moves_trust_toward_the_confirmed_share(
    start: float, cached_tokens: int, after: float
) -> None:
    past, band = ClaimShares(), ClaimShares()
    past.past = band.band = start
    past.note_routed("r", "a", 1_000, 1_000, 5_000)  # the gap past the resident cut
    band.note_routed("r", "a", 1_000, 5_000, 5_000)  # the gap within it
    for shares in (past, band):
        shares.note_usage("r", "a", 5_000, 1_250, cached_tokens)
    assert past.past == pytest.approx(after) and past.band == 1.0
    assert band.band == pytest.approx(after) and band.past == 0.0


@pytest.mark.parametrize(
    ("routed", "reported_by", "resident", "claimed"),
    [
        ("r", "b", 1_000, 5_000),  # a retry reported by another worker
        ("other", "a", 1_000, 5_000),  # a request never placed with a gap
        ("r", "a", 5_000, 5_000),  # placed with no gap: nothing to judge
    ],
)
def test_only_a_placement_with_a_gap_teaches(
    routed: str, reported_by: str, resident: int, claimed: int
) -> None:
    shares = ClaimShares()
    shares.past = 0.5
    shares.note_routed(routed, "a", resident, resident, claimed)
    shares.note_usage("r", reported_by, 5_000, 1_250, 1_250)
    assert shares.past == 0.5


def test_pending_placements_are_bounded() -> None:
    shares = ClaimShares(max_pending=2)
    for n in range(5):
        shares.note_routed(f"r{n}", "a", 0, 0, 1_000)
    shares.note_usage("r0", "a", 1_000, 250, 250)  # forgotten: teaches nothing
    assert shares.past == 0.0
    shares.note_usage("r4", "a", 1_000, 250, 250)
    assert shares.past == pytest.approx(0.1)


def test_exact_matches_read_the_same_by_count_as_by_worker() -> None:
    chars = {WorkerId(f"w{i}"): (i % 3) * 600 for i in range(9)}
    exact = frozenset(chars) | {WorkerId("idle")}
    flat = Resident(chars, exact)
    by_count: dict[int, list[WorkerId]] = {}
    for worker, held in chars.items():
        by_count.setdefault(held, []).append(worker)
    grouped = Resident(chars, exact, tuple((n, tuple(ws)) for n, ws in by_count.items()))
    found = {WorkerId("w1"): 7, WorkerId("other"): 2, WorkerId("idle"): 4}
    expected = {WorkerId("other"): 2} | {w: min(n // 256, 3) for w, n in chars.items() if n >= 256}
    for resident in (flat, grouped):
        assert exact_matches(found, resident, lambda n: n // 256, 3) == expected


def test_shared_depths_name_only_busy_workers_sharing_the_chain() -> None:
    running = RunningBlocks()
    running.add(WorkerId("a"), [1, 2, 3])
    running.add(WorkerId("b"), [1, 2, 9])
    running.add(WorkerId("c"), [7, 8])
    running.add(WorkerId("d"), [1])
    running.remove(WorkerId("d"), [1])
    among = {WorkerId("a"), WorkerId("c"), WorkerId("d")}
    assert dict(running.shared_depths([1, 2, 3, 4], among)) == {"a": 3}
    assert dict(running.shared_depths([1, 2, 3, 4], among | {WorkerId("b")})) == {"a": 3, "b": 2}
    assert dict(running.shared_depths([], among)) == {}
    for w in ("a", "b", "c", "d"):
        assert running.shared_depth(WorkerId(w), [1, 2, 3, 4]) == dict(
            running.shared_depths([1, 2, 3, 4], {WorkerId(w)})
        ).get(w, 0)


@pytest.mark.parametrize(
    ("band", "past", "expected", "likely"),
    [
        (1.0, 0.0, 600.0, 600),  # the start: the band trusted, nothing past it
        (0.8, 0.6, 100 + 0.8 * 500 + 0.6 * 400, 1000),  # each part more likely hit: all
        (0.8, 0.4, 100 + 0.8 * 500 + 0.4 * 400, 600),  # past the band: more likely missed
        (0.3, 0.9, 100 + 0.3 * 500 + 0.9 * 400, 100),  # a prefix: past a miss nothing hits
    ],
)
def test_likely_counts_each_part_of_a_claim_whole_where_it_more_likely_hits(
    band: float, past: float, expected: float, likely: int
) -> None:
    shares = ClaimShares()
    shares.band, shares.past = band, past
    assert shares.expected(100, 600, 1000) == pytest.approx(expected)
    assert shares.likely(100, 600, 1000) == likely
