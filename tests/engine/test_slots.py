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


def test_fit_recovers_a_line_and_never_a_negative_base() -> None:
    fit = fit_prefill([(100, 1.1), (200, 2.1), (400, 4.1)])
    assert fit.base_s == pytest.approx(0.1) and fit.per_token_s == pytest.approx(0.01)
    through_zero = fit_prefill([(100, 0.5), (200, 2.0)])
    assert through_zero.base_s == 0.0 and through_zero.per_token_s > 0
    with pytest.raises(ValueError):
        fit_prefill([(1, 1.0)])


def test_a_slot_keeps_one_prompt_and_reuse_without_offload_recomputes() -> None:
    w = SlotWorkerModel(1, COSTS, offload=False)
    assert w.serve("a", 100, 0) == (0, pytest.approx(1.1), "recompute")
    cached, seconds, tier = w.serve("a", 120, 1)
    assert (cached, tier) == (100, "slot") and seconds == pytest.approx(0.1 + 0.2)
    w.serve("b", 50, 2)
    assert w.serve("a", 130, 3)[0] == 0  # b took the only slot: a's KV is gone


def test_offload_saves_the_lru_holder_and_restores_it() -> None:
    w = SlotWorkerModel(1, COSTS, offload=True)
    w.serve("a", 100, 0)
    _, seconds, _ = w.serve("b", 50, 1)
    assert seconds == pytest.approx(0.05 + 0.1 + 0.5)  # a saved, b computed
    cached, seconds, tier = w.serve("a", 130, 2)
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
