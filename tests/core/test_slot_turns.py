"""What a llama.cpp worker computes of a session's next turn, from its last turn's usage."""

from __future__ import annotations

from kvgate.core.slot_turns import SlotTurns
from kvgate.types import SessionKey, WorkerId

A, B = WorkerId("a"), WorkerId("b")
S = SessionKey("s")


def none_shared(worker: WorkerId) -> int:
    return 0


def test_nothing_seen_no_word() -> None:
    assert SlotTurns().uncached(S, 4_000, [A, B], slot=None, saved=False, shared=none_shared) == ()


def test_a_later_turn_computes_its_new_characters_at_the_sessions_own_rate() -> None:
    """Its last turn: 4,400 characters in 1,100 tokens (4 a token), a reply of 32 tokens.
    The next turn re-sends both and adds 400 characters: 1,200 tokens. Its slot holds the
    prompt and all but the last reply token (1,131): 69 to compute there; restored from
    a save (the prompt alone: 1,100), 100; the same wherever it is restored."""
    turns = SlotTurns()
    turns.ended(S, A, 4_400, 1_100, 32)
    chars = 4_400 + 400
    in_slot = turns.uncached(S, chars, [A, B], slot=A, saved=False, shared=none_shared)
    assert in_slot == ((A, 69, 0.0), (B, 100, 0.0))  # on b: saved there and restored (a migration)
    on_disk = turns.uncached(S, chars, [A, B], slot=None, saved=True, shared=none_shared)
    assert on_disk == ((A, 100, 0.0), (B, 100, 0.0))


def test_a_session_whose_kv_is_gone_finds_what_the_slots_share() -> None:
    """Neither in a slot nor saved: its whole prompt (1,200 tokens) less what a slot there
    shares with it (4,000 characters on a: 1,000 tokens at its own 4 a token)."""
    turns = SlotTurns()
    turns.ended(S, A, 4_400, 1_100, 32)
    shared = {A: 4_000}.get
    got = turns.uncached(S, 4_800, [A, B], slot=None, saved=False, shared=lambda w: shared(w, 0))
    assert got == ((A, 200, 0.0), (B, 1_200, 0.0))


def test_a_new_session_is_counted_at_the_fleets_characters_a_token() -> None:
    """No turn of its own: the fleet's measure (3.5 characters a token, where the policies'
    configured 4 would book a cold 3,500-character prompt at 875 tokens, not 1,000)."""
    turns = SlotTurns()
    turns.ended(SessionKey("other"), A, 3_500, 1_000, 32)
    got = turns.uncached(
        SessionKey("new"), 3_500, [A, B], slot=None, saved=False, shared=lambda w: 2_800 * (w == A)
    )
    assert got == ((A, 200, 0.0), (B, 1_000, 0.0))


def test_what_usage_shows_was_missed_corrects_what_is_said_next() -> None:
    """The chat template's tokens around each message, a reply tokenized again: neither is
    in the characters. The misses set a correction (their median, once there are three),
    one for turns whose KV was held, one for the rest; one far off moves it little."""
    turns = SlotTurns()
    turns.ended(S, A, 4_400, 1_100, 32)
    turns.observed(True, 69.0, 99)  # 30 more computed than said
    turns.observed(True, 69.0, 0)  # a long first answer: 69 fewer
    assert turns.bias == [0.0, 0.0]  # two are no measure yet
    turns.observed(True, 69.0, 94)  # 25 more: the median of 30, -69 and 25
    got = turns.uncached(S, 4_800, [A], slot=A, saved=False, shared=none_shared)
    assert got == ((A, 69 + 25, 0.0),)
    # The rest (a new session's) keep their own: none measured yet.
    new = turns.uncached(SessionKey("n"), 4_400, [A], slot=None, saved=False, shared=none_shared)
    assert new == ((A, 1_100, 0.0),)


def test_the_sessions_kept_are_bounded() -> None:
    turns = SlotTurns(limit=2)
    for n in range(3):
        turns.ended(SessionKey(f"s{n}"), A, 4_000, 1_000, 10)
    # s0 forgotten: counted as a new session (the fleet's 4 a token, nothing held).
    got = turns.uncached(SessionKey("s0"), 4_400, [A], slot=A, saved=False, shared=none_shared)
    assert got == ((A, 1_100, 0.0),)


def test_a_miss_far_off_moves_the_correction_little() -> None:
    """A restore that failed computes the whole prompt: a miss of 1,200 tokens is not a
    bias of the count (as a running mean's, every new session after was booked at 0)."""
    turns = SlotTurns()
    for computed in (30, 1_200, 20, 40):
        turns.observed(False, 0.0 + turns.bias[1], computed)
    assert turns.bias == [0.0, 35.0]  # the median of 30, 1,200, 20 and 40


def test_the_time_before_the_engine_has_a_turn_is_told_by_what_it_finds_there() -> None:
    """Measured per kind (``prepared``): a turn in its own slot is sent at once, one whose
    KV moves waits for a restore, a new session's for its slot's holder's save or a seed."""
    turns = SlotTurns()
    turns.ended(S, A, 4_400, 1_100, 32)
    turns.prepared(SlotTurns.kind(kept=True, here=False), 0.5)  # a restore: 0.1 of the mean
    turns.prepared(SlotTurns.kind(kept=False, here=False), 1.0)
    got = turns.uncached(S, 4_800, [A, B], slot=A, saved=False, shared=none_shared)
    assert got == ((A, 69, 0.0), (B, 100, 0.1))
    new = turns.uncached(SessionKey("n"), 4_400, [A], slot=None, saved=False, shared=none_shared)
    assert new == ((A, 1_100, 0.2),)
