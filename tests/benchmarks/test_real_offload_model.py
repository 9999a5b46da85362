"""``benchmarks/real_offload_model.py``: replaying a saved fleet run in the client's order."""

from __future__ import annotations

from .loading import load_benchmark


def _turn(session: str, prompt: int, ttft: float) -> dict[str, object]:
    return {"session": session, "prompt_tokens": prompt, "ttft_s": ttft, "ok": True}


def test_sent_order_follows_the_clients_order_not_the_finishing_one() -> None:
    model = load_benchmark("real_offload_model")
    # Sent f0, f1, f0 again; recorded as they finished: f1 first, then f0's two turns.
    run = {
        "order": [0, 1, 0],
        "turns": [_turn("f1", 10, 1.0), _turn("f0", 20, 2.0), _turn("f0", 25, 0.5)],
    }
    assert [(t["session"], t["prompt_tokens"]) for t in model.sent_order(run)] == [
        ("f0", 20),
        ("f1", 10),
        ("f0", 25),
    ]
    # A wave without an order (all sent at once) stays as recorded, failed turns dropped.
    wave = {"turns": [_turn("c1", 5, 1.0), {**_turn("c0", 5, 0.0), "ok": False}]}
    assert [t["session"] for t in model.sent_order(wave)] == ["c1"]


def test_timeline_rebuilds_the_clients_schedule_from_finishing_order() -> None:
    model = load_benchmark("real_offload_model")
    # One permit: f0 is sent at 0 and answered at 1; f1 gets the permit then (answered
    # at 3); f0's second turn waits for the permit f1 frees.
    turns = [
        {**_turn("f0", 20, 1.0), "prompt_ms": 500.0},
        {**_turn("f1", 10, 2.0), "prompt_ms": 2000.0},
        {**_turn("f0", 25, 0.5), "prompt_ms": 100.0},
    ]
    out = model.timeline({"order": [0, 1, 0], "turns": turns}, 1)
    assert [(t["sent"], t["done"]) for t in out] == [(0.0, 1.0), (1.0, 3.0), (3.0, 3.5)]
    assert [round(t["wait"], 6) for t in out] == [0.5, 0.0, 0.4]
