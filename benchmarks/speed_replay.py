"""A ``real_engine.py`` run's turns replayed through the speed model, without llama.cpp.

Each turn of one policy's run is sent to ``core.speed.FleetSpeed`` at its send, reported
at its first token and at its end, booked at the uncached tokens its ``usage`` reported
(what the gateway's credit for cached KV aims at: the model's error with the guess taken
out), and fitted as the gateway fits it; the median of |predicted - observed| / observed
over the turns is the model's error on that run (issue 46's measure). A change to the
batch model (``core.batch``) or the fit is judged on the recorded runs in a second.
``--on guess`` books each turn at the uncached tokens the gateway guessed at its send
(``booked_uncached``, recorded since 2026-12-07) instead: the run's error as the gateway
made it, so the gap splits into the guess's share (guess less truth) and the model's.

Runs since 2026-12-07 record each turn's ``sent_s``/``finished_s``; for older ones the
sends are rebuilt from the run's seeded schedule (``real_engine.schedule``: a session's
second turn ``--decode-s`` after its first token plus its think time) and only rough.

    .venv/bin/python benchmarks/speed_replay.py docs/runs/real_engine_4x_share_s0.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from kvgate.core.speed import FleetSpeed, Speed

QUESTIONS = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "mt_bench" / "question.jsonl"
)


def timed(
    run: dict[str, Any], policy: str, decode_s: float, questions: Path | None = None
) -> list[tuple[dict[str, Any], float]]:
    """The policy's turns with their send (seconds from the run's first), rebuilt when the
    run has none."""
    turns = run["policies"][policy]["turns"]
    if all("sent_s" in t for t in turns):
        return [(t, t["sent_s"]) for t in turns]
    import real_engine  # its schedule, only for old runs

    cfg = run["config"]
    pairs = real_engine.load_questions(questions or real_engine.QUESTIONS)
    sessions, _ = real_engine.schedule(
        pairs, cfg["sessions"], cfg["rate"], cfg["think_s"], cfg["seed"]
    )
    start = {s.key: (s.start_s, s.think_s) for s in sessions}
    out, ends = [], {}
    for t in sorted(turns, key=lambda t: t["turn"]):
        at, think = start[t["session"]]
        sent = at if t["turn"] == 1 else ends[t["session"]] + think
        ends[t["session"]] = sent + t["ttft"] + decode_s
        t.setdefault("finished_s", ends[t["session"]])
        out.append((t, sent))
    return out


def replay(
    run: dict[str, Any],
    policy: str = "default",
    decode_s: float = 3.0,
    questions: Path | None = None,
    engine_rate: float = 30.0,
    *,
    on: str = "truth",
) -> float:
    """The median relative error of the TTFTs ``FleetSpeed`` predicts for the run's turns."""
    events = []
    for n, (turn, sent) in enumerate(timed(run, policy, decode_s, questions)):
        if turn["ttft"] is None or not turn["prompt_tokens"]:
            continue
        if on == "guess" and turn.get("booked_uncached") is None:
            continue  # no guess recorded (an old run, or one the gateway never observed)
        rid = str(n)
        events += [
            (sent, 0, rid, turn),
            (sent + turn["ttft"], 1, rid, turn),
            (turn["finished_s"], 2, rid, turn),
        ]
    events.sort(key=lambda e: (e[0], e[1]))
    model = FleetSpeed(Speed(0.0, 1 / 12_000, 0.002), at_prior=True)  # default's prior
    slots, predicted, firsts, misses = run["config"]["slots"], {}, {}, []
    for worker in {e[3]["worker"] for e in events}:
        # What its /metrics reported, where the run recorded it.
        reported = run["policies"][policy].get("learned", {}).get(worker, {})
        model.engine(worker, slots, 1 / (reported.get("engine_tokens_per_s") or engine_rate))
    for at, kind, rid, turn in events:
        prompt, cached = turn["prompt_tokens"], turn["cached_tokens"] or 0
        if kind == 0:
            booked = prompt - cached if on == "truth" else turn["booked_uncached"]
            predicted[rid] = model.sent(rid, turn["worker"], at, booked, streamed=True)
        elif kind == 1:
            model.first_token(rid, at)
            firsts[rid] = at
        else:
            model.ended(rid, prompt, cached)
            model.observed(rid, turn["ttft"])
            model.held(rid, at - firsts[rid])
            misses.append(abs(predicted[rid] - turn["ttft"]) / turn["ttft"])
    return statistics.median(misses) if misses else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("runs", nargs="+", type=Path, help="real_engine.py JSON files")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--decode-s", type=float, default=3.0, help="old runs: decoding")
    parser.add_argument("--questions", type=Path, help="old runs: MT-Bench JSONL")
    parser.add_argument(
        "--engine-rate",
        type=float,
        default=30.0,
        help="prefill tokens/s /metrics said, if unrecorded",
    )
    parser.add_argument(
        "--on",
        default="truth,guess",
        help="book turns at usage's uncached tokens (truth), the gateway's guess, or both",
    )
    args = parser.parse_args()
    for path in args.runs:
        run = json.loads(path.read_text())
        a = args
        errors = [
            f"{on} {replay(run, a.policy, a.decode_s, a.questions, a.engine_rate, on=on):.0%}"
            for on in a.on.split(",")
        ]
        print(f"{path}: median error on the " + ", on the ".join(errors))


if __name__ == "__main__":
    main()
