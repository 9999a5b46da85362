"""``workload.misses``: a request's uncached prompt tokens put down to their cause."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.sim.simulation import SimConfig, Simulation
from kvgate.workload.misses import CAUSES, Misses
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import Segment
from kvgate.workload.synthetic import build_workload

from .test_command import make_app


def _place(
    misses: Misses,
    codec: PromptCodec,
    *,
    rid: str,
    worker: str,
    segments: tuple[Segment, ...],
    reply: Segment | None = None,
) -> int:
    chain, more = codec.engine_blocks_with_reply(segments, reply)
    tokens = sum(n for _, n in segments)
    misses.placed(rid, worker, tokens, chain, more)
    return tokens


def test_each_cause_on_a_hand_computed_run() -> None:
    codec = PromptCodec(4)
    misses = Misses(4)
    system, a_user, a_reply, b_user, b_reply = (1, 8), (2, 4), (3, 4), (4, 4), (6, 4)
    # a opens a conversation: nothing seen yet, all 12 tokens new.
    _place(misses, codec, rid="a", worker="w0", segments=(system, a_user), reply=a_reply)
    misses.finished("a", 0)
    assert misses.tokens == {**dict.fromkeys(CAUSES, 0), "new": 12}
    # b shares a's system prompt on another worker: its 8 tokens are shared text missed.
    _place(misses, codec, rid="b", worker="w1", segments=(system, b_user), reply=b_reply)
    # b's next turn comes before b finished: what it misses is put down to that.
    _place(misses, codec, rid="b2", worker="w0", segments=(system, b_user, b_reply, (7, 4)))
    misses.finished("b", 0)
    misses.finished("b2", 8)
    # a's next turn goes home, where only the system prompt was left: 8 of 16 seen lost.
    a2 = (system, a_user, a_reply, (5, 4))
    _place(misses, codec, rid="a2", worker="w0", segments=a2, reply=(8, 4))
    misses.finished("a2", 8)
    # And its next one is sent elsewhere, cold: the 24 tokens seen are a move's misses.
    _place(misses, codec, rid="a3", worker="w1", segments=(*a2, (8, 4), (9, 4)), reply=None)
    misses.finished("a3", 0)
    assert misses.tokens == {
        "new": 12 + 4 + 4 + 4 + 4,
        "shared": 8,
        "turn_early": 16 - 8,
        "turn_home": 16 - 8,
        "turn_moved": 24,
    }
    assert misses.requests == {
        "new": 5,
        "shared": 1,
        "turn_early": 1,
        "turn_home": 1,
        "turn_moved": 1,
    }
    summary = misses.summary()
    prompt = 12 + 12 + 20 + 20 + 28
    assert summary["prompt_tokens"] == prompt
    computed = prompt - (0 + 0 + 8 + 8 + 0)
    assert sum(summary["tokens"].values()) == computed
    assert summary["points"]["turn_moved"] == pytest.approx(100 * 24 / prompt, abs=1e-4)


def test_a_request_never_finished_is_not_counted() -> None:
    codec = PromptCodec(4)
    misses = Misses(4)
    _place(misses, codec, rid="a", worker="w0", segments=((1, 8),), reply=None)
    assert misses.summary()["prompt_tokens"] == 0
    misses.finished("unknown", 3)  # nothing placed under that id: ignored
    assert sum(misses.tokens.values()) == 0


def test_a_named_conversation_finds_a_turn_the_blocks_do_not() -> None:
    codec = PromptCodec(4)
    found = {}
    # A trace's turn: its next turn drops the partial tail and adds whole blocks, so
    # no block marks where the first turn ended; only the conversation's name does.
    for name in ("c0", None):
        misses = Misses(4)
        opening, own, tail, more = (1, 8), (2, 6), (3, 4), (4, 10)
        chain, _ = codec.engine_blocks_with_reply((opening, own, tail), None)
        misses.placed("a", "w0", 18, chain, (), conversation=name)
        misses.finished("a", 0)
        chain, _ = codec.engine_blocks_with_reply((opening, own, more), None)
        misses.placed("a2", "w1", 24, chain, (), conversation=name)
        misses.finished("a2", 0)
        found[name] = misses.tokens
    # The 12 tokens the first turn had: lost on a move when named, shared text when not.
    assert found["c0"] == {**dict.fromkeys(CAUSES, 0), "new": 18 + 12, "turn_moved": 12}
    assert found[None] == {**dict.fromkeys(CAUSES, 0), "new": 18 + 12, "shared": 12}


def test_a_moved_turn_is_charged_only_what_its_home_still_held() -> None:
    codec = PromptCodec(4)
    system, user, reply = (1, 8), (2, 4), (3, 4)
    chain, more = codec.engine_blocks_with_reply((system, user), reply)
    turn, _ = codec.engine_blocks_with_reply((system, user, reply, (4, 4)), None)
    found: dict[int | None, tuple[int, int]] = {}
    for home_held in (16, 8, None):
        misses = Misses(4)
        misses.placed("a", "w0", 12, chain, more)
        misses.finished("a", 0)
        # The next turn goes to w1 (cold): its home held all 16 seen tokens, or only
        # the system prompt's 8 (the rest evicted), or the run cannot say.
        held = None if home_held is None else {"w0": home_held, "w1": 0}.__getitem__
        misses.placed("a2", "w1", 20, turn, (), held=held)
        misses.finished("a2", 0)
        found[home_held] = (misses.tokens["turn_moved"], misses.tokens["turn_home"])
    assert found == {16: (16, 0), 8: (8, 8), None: (16, 0)}


def _run(policy: str, workload_name: str = "headerless-chat", kv: int = 400) -> dict[str, Any]:
    config = SimConfig(workers=4, kv_blocks=(kv,), block_size=16, seed=3, max_requests=160)
    workload = build_workload(workload_name, seed=3)
    return Simulation(config, workload.requests(), policy, misses=True).run().summary


def test_the_causes_add_up_to_the_hit_rate_and_tell_policies_apart() -> None:
    runs = {policy: _run(policy) for policy in ("round_robin", "default")}
    for summary in runs.values():
        misses = summary["misses"]
        assert 100.0 - sum(misses["points"].values()) == pytest.approx(
            100.0 * float(summary["hit_rate"]), abs=0.01
        )
    rr, default = (runs[p]["misses"] for p in ("round_robin", "default"))
    # New text depends on the workload, not on where it was placed.
    assert rr["tokens"]["new"] == default["tokens"]["new"]
    # Round robin scatters conversations; default keeps them with their cache.
    assert rr["points"]["turn_moved"] > 10 * max(default["points"]["turn_moved"], 0.1)


def test_a_trace_shaped_workload_has_its_turns_found() -> None:
    # Its turns re-send no reply and drop their last block: the generator names them.
    misses = _run("round_robin", "shared-opening-trace", kv=4000)["misses"]
    turns = sum(misses["tokens"][cause] for cause in ("turn_early", "turn_home", "turn_moved"))
    assert turns > misses["tokens"]["shared"] > 0


def test_sim_misses_prints_the_causes_and_puts_them_in_json() -> None:
    args = ["sim", "--workload", "headerless-chat", "--requests", "60", "--workers", "2",
            "--policies", "round_robin,default", "--no-progress", "--misses"]  # fmt: skip
    table = CliRunner().invoke(make_app(), args, terminal_width=80)
    assert table.exit_code == 0, table.output
    assert "misses by cause" in table.output
    assert "moved" in table.output and "…" not in table.output
    as_json = CliRunner().invoke(make_app(), [*args, "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    policies = json.loads(as_json.stdout)["policies"]
    assert set(policies["default"]["misses"]["points"]) == set(CAUSES)
    plain = CliRunner().invoke(make_app(), [*args[:-1], "--format", "json"])
    assert "misses" not in json.loads(plain.stdout)["policies"]["default"]
