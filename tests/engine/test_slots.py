"""``engine.slots``: llama.cpp's per-slot cache as the engine model sees it."""

from __future__ import annotations

import pytest

from kvgate.engine.slots import (
    PrefillFit,
    SlotCosts,
    SlotWorkerModel,
    fit_prefill,
    predict_returning,
    replay_fleet,
)

COSTS = SlotCosts(PrefillFit(0.1, 0.01), save_s=0.05, restore_s=0.02)


def _turn(w: SlotWorkerModel, session: str, prompt: int, now: float) -> tuple[int, float, str]:
    """One whole turn: started at ``now`` and done right after."""
    result = w.serve(session, prompt, now)
    w.done(session, now)
    return result


def test_fit_recovers_a_line_and_never_a_negative_base() -> None:
    fit = fit_prefill([(100, 1.1), (200, 2.1), (400, 4.1)])
    assert fit.base_s == pytest.approx(0.1) and fit.per_token_s == pytest.approx(0.01)
    through_zero = fit_prefill([(100, 0.5), (200, 2.0)])
    assert through_zero.base_s == 0.0 and through_zero.per_token_s > 0
    with pytest.raises(ValueError):
        fit_prefill([(1, 1.0)])


def test_a_slot_keeps_one_prompt_and_reuse_without_offload_recomputes() -> None:
    w = SlotWorkerModel(1, COSTS, offload=False)
    assert _turn(w, "a", 100, 0) == (0, pytest.approx(1.1), "recompute")
    cached, seconds, tier = _turn(w, "a", 120, 1)
    assert (cached, tier) == (100, "slot") and seconds == pytest.approx(0.1 + 0.2)
    _turn(w, "b", 50, 2)
    assert _turn(w, "a", 130, 3)[0] == 0  # b took the only slot: a's KV is gone


def test_offload_saves_the_lru_holder_and_restores_it() -> None:
    w = SlotWorkerModel(1, COSTS, offload=True)
    _turn(w, "a", 100, 0)
    _, seconds, _ = _turn(w, "b", 50, 1)
    assert seconds == pytest.approx(0.05 + 0.1 + 0.5)  # a saved, b computed
    cached, seconds, tier = _turn(w, "a", 130, 2)
    assert (cached, tier) == (100, "disk")
    assert seconds == pytest.approx(0.05 + 0.02 + 0.1 + 0.3)  # b saved, a restored, 30 new
    assert predict_returning(COSTS, 130, 100, restored=True, saved=True) == pytest.approx(seconds)


def test_fleet_replay_is_deterministic_and_offload_raises_the_hit_rate() -> None:
    turns = [(f"s{i % 6}", 200 + 20 * (i // 6), i % 2) for i in range(24)]
    off = replay_fleet(COSTS, turns, workers=2, slots=2, concurrency=3, offload=False)
    on = replay_fleet(COSTS, turns, workers=2, slots=2, concurrency=3, offload=True)
    assert off == replay_fleet(COSTS, turns, workers=2, slots=2, concurrency=3, offload=False)
    hits_off = sum(t.cached_tokens for t in off)
    hits_on = sum(t.cached_tokens for t in on)
    assert hits_on > hits_off
    assert sum(t.ttft_s for t in on) < sum(t.ttft_s for t in off)
    assert all(t.ttft_s > 0 for t in on + off)


def test_busy_slots_share_the_thread_and_queue_the_rest() -> None:
    # One worker of two slots, three sessions sent at once.
    turns = [("a", 100, 0), ("b", 100, 0), ("c", 100, 0)]
    out = replay_fleet(COSTS, turns, workers=1, slots=2, concurrency=3, offload=False)
    # a and b share the thread (1.1 s of work each: both done at 2.2 s); c then runs alone.
    assert [t.ttft_s for t in out] == pytest.approx([2.2, 2.2, 3.3])
    w = SlotWorkerModel(1, COSTS, offload=False)
    w.serve("a", 10, 0)
    with pytest.raises(RuntimeError):
        w.serve("b", 10, 0)
