"""``engine.slots``: llama.cpp's per-slot cache as the engine model sees it."""

from __future__ import annotations

import pytest

from kvgate.engine.slots import (
    PrefillFit,
    PrefillSample,
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


def test_workers_sharing_fewer_cores_slow_down_together() -> None:
    turns = [("a", 100, 0), ("b", 100, 1)]
    own = replay_fleet(COSTS, turns, workers=2, slots=1, concurrency=2, offload=False)
    shared = replay_fleet(
        COSTS, turns, workers=2, slots=1, concurrency=2, offload=False, host_cores=1.0
    )
    assert [t.ttft_s for t in own] == pytest.approx([1.1, 1.1])
    assert [t.ttft_s for t in shared] == pytest.approx([2.2, 2.2])  # one core for two
    alone = replay_fleet(COSTS, turns[:1], workers=2, slots=1, concurrency=1, offload=False,
                         host_cores=1.0)  # fmt: skip
    assert alone[0].ttft_s == pytest.approx(1.1)  # one busy worker has the core to itself
