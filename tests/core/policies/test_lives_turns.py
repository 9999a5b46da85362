"""``Lives``: a headerless conversation's turns and prefill, measured as it goes (``turn``)."""

from __future__ import annotations

import pytest

from kvgate.core.policies.lives import Lives

FOREVER = 1e9  # no halving: the counts as they are


def lives(capacity: int = 65_536) -> Lives:
    return Lives(lambda n: 256 * n, capacity, half_s=FOREVER)


def test_one_shot_traffic_is_one_turn_of_its_own_prefill() -> None:
    seen = lives()
    assert (seen.turns(), seen.chain_life()) == (1.0, 0.0)
    for n in range(10):
        seen.turn(f"q{n}", float(n), 0.2, None)
    assert seen.turns() == 1.0
    assert seen.chain_life() == pytest.approx(0.2)


def test_young_conversations_read_long_until_their_last_turns_go_unanswered() -> None:
    """Two conversations, an opening of 0.3 s and three later turns of 0.1 s, 1 s apart."""
    seen = lives()
    for n in range(2):
        seen.turn(f"c{n}-0", 0.0, 0.3, None)
    for turn in range(1, 4):
        for n in range(2):
            seen.turn(f"c{n}-{turn}", float(turn), 0.1, f"c{n}-{turn - 1}")
    # 6 turns continued, none final yet: 1 + 6 / (0 + 1) turns.
    assert seen.turns() == pytest.approx(7.0)
    seen.turn("x", 10.0, 0.3, None)  # 4 mean gaps (1 s) on: both last turns are final
    assert seen.turns() == pytest.approx(1 + 6 / 3)
    assert seen.chain_life() == pytest.approx(0.3 + 2 * 0.1)


def test_a_turn_judged_final_and_answered_later_counts_as_continued() -> None:
    """The gaps measured first are the short ones: a slower next turn undoes its final."""
    seen = lives()
    seen.turn("a0", 0.0, 0.3, None)
    seen.turn("a1", 1.0, 0.1, "a0")  # gap 1 s
    seen.turn("b0", 2.0, 0.3, None)
    seen.turn("x", 10.0, 0.3, None)  # a1 and b0 final: 1 continued, 2 final
    assert seen.turns() == pytest.approx(1 + 1 / 3)
    seen.turn("b1", 11.0, 0.1, "b0")  # b0 was continued after all
    assert seen.turns() == pytest.approx(1 + 2 / 2)


def test_pending_turns_are_bounded() -> None:
    seen = lives(capacity=4)
    for n in range(10):
        seen.turn(f"q{n}", 0.0, 0.1, None)
    assert len(seen._pending) == 4
    seen.turn("q9-next", 1.0, 0.1, "q9")  # still pending: continued
    seen.turn("q0-next", 1.0, 0.1, "q0")  # forgotten: a later turn, not a continuation
    assert seen.turns() == pytest.approx(2.0)
