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
    # the second 35 s (34 seen: 50 tokens of its own, all 1,000 of the first's beside).
    turns = [turn("a", 0.0, 35.0, 0), turn("b", 1.0, 34.0, 950)]
    run = {"config": {"slots": 4}, "policies": {"default": {"turns": turns}}}
    error = bench.replay(run, engine_rate=30.0)
    assert math.isclose(error, ((35 - 1000 / 30) / 35 + 1 / 34) / 2)
