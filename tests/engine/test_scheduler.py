"""The scheduler through the Engine facade: batching, chunked prefill, preemption, fusion."""

import zlib

import pytest

from kvgate.engine import Engine, EngineConfig, EngineRequest
from kvgate.engine.profiles import PROFILES

from .drive import Arrival, prompt_hashes, run


def request(
    rid: str, tokens: int, out: int, *, family: int = 0, shared: int = 0, bs: int = 16
) -> EngineRequest:
    return EngineRequest(
        rid, prompt_hashes(family, shared, zlib.crc32(rid.encode()), tokens, bs), tokens, out
    )


def test_ttft_is_queue_wait_plus_prefill_of_the_prompt() -> None:
    cfg = EngineConfig(profile="h100-llama3-8b")
    engine = Engine(cfg)
    engine.submit(request("a", 1000, 4), 5.0)
    result = engine.step(5.0)
    p = PROFILES["h100-llama3-8b"]
    assert result.first_tokens == [("a", 0)]
    assert result.duration == pytest.approx(p.step_time(1000, 0, 0))
    assert result.tokens == {"a": 1}


def test_long_prompts_are_prefilled_in_chunks() -> None:
    cfg = EngineConfig(profile="fast", max_batched_tokens=512, num_gpu_blocks=1000)
    engine = Engine(cfg)
    engine.submit(request("a", 1300, 2), 0.0)
    chunks = []
    now = 0.0
    while not engine.stats(now).generation_tokens_total:
        r = engine.step(now)
        chunks.append(r.prefill_tokens)
        now += r.duration
    assert chunks == [512, 512, 1300 - 1024]


def test_running_batch_respects_max_num_seqs_and_token_budget() -> None:
    cfg = EngineConfig(profile="fast", max_num_seqs=3, max_batched_tokens=100, num_gpu_blocks=500)
    engine = Engine(cfg)
    arrivals = [Arrival(0.0, request(f"r{i}", 70, 5)) for i in range(8)]

    def check(e: Engine, r) -> None:
        assert e.num_running <= 3
        decode = sum(n for rid, n in r.tokens.items()) if r.steps == 1 else 0
        assert r.prefill_tokens <= 100
        assert decode <= 3

    out = run(engine, arrivals, check=check)
    assert set(out.finished) == {f"r{i}" for i in range(8)}


def test_second_identical_prompt_hits_all_but_the_last_token_block() -> None:
    bs = 16
    engine = Engine(EngineConfig(profile="fast", num_gpu_blocks=400))
    tokens = 20 * bs  # an exact multiple: the last block must be recomputed
    hashes = prompt_hashes(1, tokens, 0, tokens, bs)
    run(engine, [Arrival(0.0, EngineRequest("a", hashes, tokens, 3))])
    out = run(engine, [Arrival(0.0, EngineRequest("b", hashes, tokens, 3))])
    assert out.first_tokens["b"] == (tokens - 1) // bs * bs


def test_partial_last_block_is_not_shared() -> None:
    bs = 16
    engine = Engine(EngineConfig(profile="fast", num_gpu_blocks=400))
    tokens = 2 * bs + 9
    hashes = prompt_hashes(1, tokens, 0, tokens, bs)
    run(engine, [Arrival(0.0, EngineRequest("a", hashes, tokens, 3))])
    out = run(engine, [Arrival(0.0, EngineRequest("b", hashes, tokens, 3))])
    assert out.first_tokens["b"] == 2 * bs


def test_cached_prefix_makes_ttft_shorter() -> None:
    engine = Engine(EngineConfig(profile="h100-llama3-8b", num_gpu_blocks=2000))
    shared = 1536
    a = run(engine, [Arrival(0.0, request("a", 2048, 2, family=3, shared=shared))])
    b = run(engine, [Arrival(0.0, request("b", 2048, 2, family=3, shared=shared))])
    assert b.first_tokens["b"] == shared
    assert b.finished["b"].ttft < a.finished["a"].ttft


def test_preemption_recomputes_the_most_recent_request() -> None:
    bs = 16
    # Room for both prompts but not for both to grow to their full output.
    cfg = EngineConfig(profile="fast", block_size=bs, num_gpu_blocks=12, max_batched_tokens=256)
    engine = Engine(cfg)
    arrivals = [Arrival(0.0, request("old", 64, 64)), Arrival(0.001, request("new", 64, 64))]
    engine.submit(arrivals[0].request, 0.0)
    engine.step(0.0)
    out = run(engine, arrivals[1:])
    assert out.preempted
    assert set(out.preempted) == {"new"}
    assert out.finished["new"].preemptions >= 1
    assert out.finished["old"].preemptions == 0
    assert out.tokens["new"] == 64
    assert engine.stats(out.end).preemptions == len(out.preempted)


def test_without_preemption_requests_reserve_their_blocks() -> None:
    cfg = EngineConfig(profile="fast", num_gpu_blocks=12, max_batched_tokens=256, preemption=False)
    engine = Engine(cfg)
    arrivals = [Arrival(0.0, request(f"r{i}", 64, 64)) for i in range(3)]

    def check(e: Engine, r) -> None:
        assert e.num_running <= 1  # 64 + 64 tokens need 8 of the 12 blocks

    out = run(engine, arrivals, check=check)
    assert not out.preempted
    assert len(out.finished) == 3


def test_fused_decode_steps_match_single_steps() -> None:
    def workload() -> list[Arrival]:
        return [Arrival(0.01 * i, request(f"r{i}", 300 + 37 * i, 20 + 9 * i)) for i in range(6)]

    cfg = EngineConfig(profile="h100-llama3-8b", num_gpu_blocks=3000)
    single = run(Engine(cfg), workload())
    fused = run(Engine(cfg), workload(), horizon=10.0)
    assert fused.steps == single.steps
    assert fused.tokens == single.tokens
    for rid, fin in single.finished.items():
        assert fused.finished[rid].finish_time == pytest.approx(fin.finish_time)
        assert fused.finished[rid].first_token_time == pytest.approx(fin.first_token_time)


def test_fusion_respects_horizon_and_stops_at_the_next_finish() -> None:
    engine = Engine(EngineConfig(profile="h100-llama3-8b", num_gpu_blocks=3000))
    engine.submit(request("short", 100, 10), 0.0)
    engine.submit(request("long", 100, 1000), 0.0)
    now = engine.step(0.0).duration
    first = engine.step(now, horizon=100.0)
    assert first.steps == 9
    assert [f.request_id for f in first.finished] == ["short"]
    now += first.duration
    horizon = 0.05
    limited = engine.step(now, horizon=horizon)
    assert 1 < limited.steps < 1000
    assert limited.duration <= horizon
    assert limited.tokens == {"long": limited.steps}


def test_no_fusion_while_a_request_waits_to_be_admitted() -> None:
    cfg = EngineConfig(profile="fast", num_gpu_blocks=3000, max_batched_tokens=64)
    engine = Engine(cfg)
    engine.submit(request("a", 40, 50), 0.0)
    engine.submit(request("b", 200, 50), 0.0)
    r = engine.step(0.0, horizon=100.0)
    assert r.steps == 1
    r = engine.step(r.duration, horizon=100.0)
    assert r.steps == 1  # b is still prefilling in chunks
