"""``benchmarks/speed_replay.py``: a run's turns through the speed model, offline."""

from __future__ import annotations

import math

from .loading import load_benchmark


def test_a_recorded_run_is_replayed_turn_by_turn() -> None:
    bench = load_benchmark("speed_replay")

    def turn(session: str, sent: float, ttft: float, cached: int) -> dict[str, object]:
        return {
            "session": session, "turn": 1, "worker": "w", "prompt_tokens": 1000,
            "cached_tokens": cached, "ttft": ttft, "sent_s": sent,
            "finished_s": sent + ttft + 2.0,
        }  # fmt: skip

    # A cold prompt and a short one sent beside it: both at their first token with the one
    # batch; at the engine's 30 tokens a second the first is predicted 33.3 s (35 seen),
    # the second 34 s (34 seen: 50 tokens of its own, beside what is left of the first's
    # 1,000 a second after it began: 970).
    turns = [turn("a", 0.0, 35.0, 0), turn("b", 1.0, 34.0, 950)]
    run = {"config": {"slots": 4}, "policies": {"default": {"turns": turns}}}
    error = bench.replay(run, engine_rate=30.0)
    assert math.isclose(error, (35 - 1000 / 30) / 35 / 2)


def test_a_run_is_replayed_on_the_gateways_guess_as_well_as_on_the_truth() -> None:
    """``on="guess"`` books each turn at the uncached tokens the gateway booked it at
    (``booked_uncached``): the run's error as the gateway made it, beside the model's."""
    bench = load_benchmark("speed_replay")
    turn = {
        "session": "a", "turn": 1, "worker": "w", "prompt_tokens": 1000, "cached_tokens": 0,
        "ttft": 35.0, "sent_s": 0.0, "finished_s": 37.0, "booked_uncached": 600.0,
    }  # fmt: skip
    run = {"config": {"slots": 4}, "policies": {"default": {"turns": [turn]}}}
    assert math.isclose(bench.replay(run, engine_rate=30.0), (35 - 1000 / 30) / 35)
    assert math.isclose(bench.replay(run, engine_rate=30.0, on="guess"), (35 - 600 / 30) / 35)
