"""``engine.slots``: llama.cpp's per-slot cache as the engine model sees it."""

from __future__ import annotations

import pytest

from kvgate.engine.slots import (
    PrefillFit,
    PrefillSample,
    ServerLoop,
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


def _cold(*points: tuple[int, float]) -> list[PrefillSample]:
    return [PrefillSample(n, 0, y) for n, y in points]


def test_fit_recovers_a_line_and_never_a_negative_base() -> None:
    fit = fit_prefill(_cold((100, 1.1), (200, 2.1), (400, 4.1)))
    assert fit.base_s == pytest.approx(0.1) and fit.per_token_s == pytest.approx(0.01)
    assert fit.per_cached_pair_s == 0.0  # no warm sample: the term is not seen
    through_zero = fit_prefill(_cold((100, 0.5), (200, 2.0)))
    assert through_zero.base_s == 0.0 and through_zero.seconds(200) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        fit_prefill(_cold((1, 1.0)))


def test_fit_on_warm_samples_finds_the_cached_context_term() -> None:
    # Cold prefills cost 0.1 s + 10 ms a token; a few new tokens after a long cached
    # context pay 10 us more per (new token x cached token) pair.
    truth = PrefillFit(0.1, 0.01, 0.0, 1e-5)
    shapes = [(100, 0), (400, 0), (1_600, 0), (40, 500), (40, 1_500), (40, 3_000)]
    fit = fit_prefill([PrefillSample(n, c, truth.seconds(n, c)) for n, c in shapes])
    assert fit.per_cached_pair_s == pytest.approx(1e-5, rel=1e-6)
    assert fit.seconds(30, 2_000) == pytest.approx(truth.seconds(30, 2_000))
    # Fitted on cold prompts only, the same warm turn comes out too cheap.
    cold_only = fit_prefill([PrefillSample(n, 0, truth.seconds(n, 0)) for n, _ in shapes[:3]])
    assert cold_only.seconds(30, 2_000) < 0.5 * truth.seconds(30, 2_000)


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


LINEAR = SlotCosts(PrefillFit(0.0, 0.01), save_s=0.5, restore_s=0.25)
"""10 ms a new token, nothing else: step times are token counts over 100."""


def test_busy_slots_decode_in_one_batch_and_queue_the_rest() -> None:
    # One worker of two slots, three 100-token prompts sent at once, no checkpoint tail:
    # a and b are decoded in one step (2 s); c waits for a slot, then runs alone.
    turns = [("a", 100, 0), ("b", 100, 0), ("c", 100, 0)]
    loop = ServerLoop(checkpoint_tail=0)
    out = replay_fleet(LINEAR, turns, workers=1, slots=2, concurrency=3, offload=False, loop=loop)
    assert [t.ttft_s for t in out] == pytest.approx([2.0, 2.0, 3.0])
    w = SlotWorkerModel(1, COSTS, offload=False)
    w.serve("a", 10, 0)
    with pytest.raises(RuntimeError):
        w.serve("b", 10, 0)


def test_a_short_turn_beside_a_long_prefill_waits_for_the_whole_step() -> None:
    # a's second turn (10 new tokens) is sent when b's 500-token prompt is: llama.cpp
    # decodes both in one step, so a's short turn ends only when b's prefill does.
    turns = [("a", 100, 0), ("a", 110, 0), ("b", 500, 0)]
    loop = ServerLoop(checkpoint_tail=0)
    out = replay_fleet(LINEAR, turns, workers=1, slots=2, concurrency=2, offload=False, loop=loop)
    assert out[1].cached_tokens == 100
    assert out[1].ttft_s == pytest.approx(0.1 + 5.0)  # sent at 1 s with b: one 5.1 s step
    assert out[2].ttft_s == pytest.approx(5.1)  # b's permit came with a's first turn's end
    # Alone, the same short turn costs only its own tokens, as predict_returning says.
    alone = replay_fleet(LINEAR, turns[:2], workers=1, slots=2, concurrency=1, offload=False)
    assert alone[1].ttft_s == pytest.approx(predict_returning(LINEAR, 110, 100, restored=False,
                                                              saved=False))  # fmt: skip


def test_the_checkpoint_tail_is_a_step_of_its_own() -> None:
    # b (300 tokens) and c (30 tokens) start together: the first step holds b's first 236
    # tokens and all of c, which ends with it; b's last 64 tokens follow alone.
    turns = [("b", 300, 0), ("c", 30, 0)]
    out = replay_fleet(LINEAR, turns, workers=1, slots=2, concurrency=2, offload=False)
    assert [t.ttft_s for t in out] == pytest.approx([3.3, 2.66])
    # However a prompt is split, its steps add up to its whole prefill.
    alone = replay_fleet(COSTS, turns[:1], workers=1, slots=1, concurrency=1, offload=False)
    assert alone[0].ttft_s == pytest.approx(COSTS.prefill.seconds(300))


def test_each_save_and_restore_call_waits_for_the_running_step() -> None:
    # One worker of two slots, offload on: a and b fill both slots (one 2 s step); at
    # 2 s c takes a's slot (a saved) and a, returning, takes b's (b saved, a restored).
    turns = [("a", 100, 0), ("b", 100, 0), ("c", 50, 0), ("a", 110, 0)]
    loop = ServerLoop(checkpoint_tail=0)
    out = replay_fleet(LINEAR, turns, workers=1, slots=2, concurrency=4, offload=True, loop=loop)
    assert [t.tier for t in out] == ["recompute", "recompute", "recompute", "disk"]
    assert out[3].cached_tokens == 100
    # The loop runs one call at a time, and the gateway sends a turn's next call only
    # once the last one answered: save a (2-2.5 s), save b (2.5-3), c's prompt (3-3.5),
    # a's restore (3.5-3.75), a's 10 new tokens (3.75-3.85).
    assert out[2].ttft_s == pytest.approx(3.5)
    assert out[3].ttft_s == pytest.approx(1.85)  # sent at 2 s; 0.85 s of its own work


def test_workers_sharing_fewer_cores_slow_down_together() -> None:
    turns = [("a", 100, 0), ("b", 100, 1)]
    own = replay_fleet(COSTS, turns, workers=2, slots=1, concurrency=2, offload=False)
    shared = replay_fleet(
        COSTS, turns, workers=2, slots=1, concurrency=2, offload=False, host_cores=1.0
    )
    assert [t.ttft_s for t in own] == pytest.approx([1.1, 1.1])
    # One core for two: each loop's work takes twice as long (the fixed 0.1 s is outside).
    assert [t.ttft_s for t in shared] == pytest.approx([2.1, 2.1])
    alone = replay_fleet(COSTS, turns[:1], workers=2, slots=1, concurrency=1, offload=False,
                         host_cores=1.0)  # fmt: skip
    assert alone[0].ttft_s == pytest.approx(1.1)  # one busy worker has the core to itself
