"""ClaimTrust: the share of unverified cache claims counted, learned from usage reports."""

from __future__ import annotations

import pytest

from kvgate.core.policies.claims import ClaimTrust


@pytest.mark.parametrize(
    ("trust", "resident", "claimed", "expected"),
    [
        (0.0, 1_000, 5_000, 1_000),  # nothing vouched past the resident cache counts
        (0.5, 1_000, 5_000, 3_000),
        (1.0, 1_000, 5_000, 5_000),
        (0.5, 5_000, 5_000, 5_000),  # all of it resident: no gap to discount
        (0.5, 0, 0, 0),
    ],
)
def test_expected_cache_is_the_resident_part_and_the_trusted_share_of_the_rest(
    trust: float, resident: int, claimed: int, expected: float
) -> None:
    assert ClaimTrust(trust=trust).expected(resident, claimed) == pytest.approx(expected)


# One placement on "a" with 1,000 characters resident and 5,000 claimed (4 characters
# a token); the worker then reports ``cached_tokens``. Trust moves a tenth of the way
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
    trust = ClaimTrust(trust=start)
    trust.note_routed("r", "a", 1_000, 5_000)
    trust.note_usage("r", "a", 5_000, 1_250, cached_tokens)
    assert trust.trust == pytest.approx(after)


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
    trust = ClaimTrust(trust=0.5)
    trust.note_routed(routed, "a", resident, claimed)
    trust.note_usage("r", reported_by, 5_000, 1_250, 1_250)
    assert trust.trust == 0.5


def test_pending_placements_are_bounded() -> None:
    trust = ClaimTrust(max_pending=2)
    for n in range(5):
        trust.note_routed(f"r{n}", "a", 0, 1_000)
    trust.note_usage("r0", "a", 1_000, 250, 250)  # forgotten: teaches nothing
    assert trust.trust == 0.0
    trust.note_usage("r4", "a", 1_000, 250, 250)
    assert trust.trust == pytest.approx(0.1)
