"""The Engine facade: submit/abort, offload and restore, sessions, stats and GPU model."""

import pytest

from kvgate.engine import Engine, EngineConfig, EngineRequest
from kvgate.engine.profiles import MIB

from .drive import Arrival, prompt_hashes, run

BS = 16


def req(rid: str, tokens: int, out: int = 4, family: int = 0, session: str | None = None):
    hashes = prompt_hashes(family, tokens, 0, tokens, BS)
    return EngineRequest(rid, hashes, tokens, out, session_id=session)


def test_submit_rejects_duplicates_empty_and_oversized_requests() -> None:
    engine = Engine(EngineConfig(profile="fast", num_gpu_blocks=10))
    engine.submit(req("a", 32), 0.0)
    with pytest.raises(ValueError, match="already"):
        engine.submit(req("a", 32), 0.0)
    with pytest.raises(ValueError):
        engine.submit(EngineRequest("z", [], 0, 4), 0.0)
    assert not engine.fits(10 * BS, 1)
    with pytest.raises(ValueError, match="KV cache"):
        engine.submit(req("big", 10 * BS), 0.0)


def test_abort_frees_blocks_of_running_and_waiting_requests() -> None:
    engine = Engine(EngineConfig(profile="fast", num_gpu_blocks=100, max_num_seqs=1))
    engine.submit(req("run", 64, 50, family=1), 0.0)
    engine.submit(req("wait", 64, 50, family=2), 0.0)
    engine.step(0.0)
    assert engine.kv_usage > 0
    assert engine.abort("wait", 0.1)
    assert engine.abort("run", 0.1)
    assert not engine.abort("run", 0.1)
    assert not engine.has_work()
    stats = engine.stats(0.2)
    assert (stats.kv_usage, stats.requests_aborted, stats.gpu_blocks_cached) == (0.0, 2, 64 // BS)


def test_stats_report_counters_and_histograms() -> None:
    engine = Engine(EngineConfig(profile="fast", num_gpu_blocks=100))
    out = run(engine, [Arrival(0.0, req("a", 40, 5)), Arrival(0.0, req("b", 40, 7))])
    stats = engine.stats(out.end)
    assert (stats.requests_finished, stats.running, stats.waiting) == (2, 0, 0)
    assert stats.prompt_tokens_total == 80
    assert stats.generation_tokens_total == 12
    assert stats.prefix_cache_queries == 80
    assert stats.prefix_cache_hits == stats.prefix_hits == 32  # b hits a's 2 full blocks
    assert stats.ttft.count == stats.e2e.count == 2
    assert stats.e2e.sum == pytest.approx(sum(f.e2e for f in out.finished.values()))


def test_gpu_memory_counts_weights_plus_blocks_in_use() -> None:
    cfg = EngineConfig(profile="h100-llama3-8b", num_gpu_blocks=1000)
    engine = Engine(cfg)
    assert engine.stats(0.0).gpu_mem_used_mib == pytest.approx(cfg.weights_mib)
    engine.submit(req("a", 160, 100), 0.0)
    engine.step(0.0)
    stats = engine.stats(1.0)
    expected = cfg.weights_mib + stats.gpu_blocks_in_use * cfg.kv_bytes_per_block / MIB
    # The prompt's 10 blocks; the next token's block is taken when it is computed.
    assert stats.gpu_blocks_in_use == 160 // BS
    assert stats.gpu_mem_used_mib == pytest.approx(expected)
    assert stats.gpu_mem_total_mib == cfg.gpu_total_mib


def test_gpu_heats_under_load_and_cools_when_idle() -> None:
    cfg = EngineConfig(profile="cpu-small", num_gpu_blocks=2000)
    engine = Engine(cfg)
    idle = engine.stats(0.0).gpu_temp_c
    out = run(engine, [Arrival(0.0, req(f"r{i}", 400, 500, family=i)) for i in range(4)])
    assert out.end > cfg.thermal_time_constant_s
    hot = engine.stats(out.end).gpu_temp_c
    cooled = engine.stats(out.end + 10 * cfg.thermal_time_constant_s).gpu_temp_c
    assert idle == cfg.idle_temp_c
    assert idle < cooled < hot <= cfg.max_temp_c


def offload_engine(**kwargs: object) -> Engine:
    cfg = EngineConfig(profile="h100-llama3-8b", num_gpu_blocks=400, **kwargs)  # type: ignore[arg-type]
    return Engine(cfg)


def test_offloaded_session_is_restored_faster_than_recomputed() -> None:
    tokens = 2000
    ttft = {}
    for name, cpu_blocks in (("restored", 1000), ("recomputed", 0)):
        engine = offload_engine(cpu_offload_blocks=cpu_blocks)
        run(engine, [Arrival(0.0, req("t1", tokens, session="s"))])
        result = engine.offload(session_ids=["s"], now=1.0)
        assert result.freed == tokens // BS
        assert engine.stats(1.0).gpu_blocks_cached == 0
        out = run(engine, [Arrival(0.0, req("t2", tokens, session="s"))])
        ttft[name] = out.finished["t2"].ttft
        if cpu_blocks:
            assert result.offloaded == tokens // BS
            assert out.first_tokens["t2"] == (tokens - 1) // BS * BS
            assert engine.stats(out.end).restored_blocks == (tokens - 1) // BS
        else:
            assert result.dropped == tokens // BS
            assert out.first_tokens["t2"] == 0
    hot = offload_engine()
    run(hot, [Arrival(0.0, req("t1", tokens, session="s"))])
    gpu_hit = run(hot, [Arrival(0.0, req("t2", tokens, session="s"))]).finished["t2"].ttft
    assert gpu_hit < ttft["restored"] < ttft["recomputed"]


def test_a_copied_session_is_served_from_the_gpu_while_it_lasts_then_restored() -> None:
    tokens = 2000
    hot = offload_engine(cpu_offload_blocks=1000)
    run(hot, [Arrival(0.0, req("t1", tokens, session="s"))])
    copied = hot.offload(session_ids=["s"], now=1.0, copy=True)
    assert (copied.copied, copied.freed) == (tokens // BS, 0)  # a backup: nothing freed
    assert hot.residency("s").gpu == hot.stats(1.0).cpu_offload_blocks_used == tokens // BS
    kept = run(hot, [Arrival(0.0, req("t2", tokens, session="s"))])
    assert hot.stats(kept.end).restored_blocks == 0  # the GPU's copy was still there
    # Once other work evicted the GPU's copy, the tier's is restored, not recomputed.
    evicted = offload_engine(cpu_offload_blocks=1000)
    run(evicted, [Arrival(0.0, req("t1", tokens, session="s"))])
    evicted.offload(session_ids=["s"], now=1.0, copy=True)
    run(evicted, [Arrival(0.0, req("other", 400 * BS - BS, family=9))])
    assert evicted.residency("s").gpu < tokens // BS
    back = run(evicted, [Arrival(0.0, req("t2", tokens, session="s"))])
    assert back.first_tokens["t2"] == (tokens - 1) // BS * BS
    assert evicted.stats(back.end).restored_blocks > 0
    assert kept.finished["t2"].ttft < back.finished["t2"].ttft


def test_offload_skips_blocks_in_use_and_unknown_blocks() -> None:
    engine = offload_engine(cpu_offload_blocks=100)
    engine.submit(req("a", 64, 100, session="s"), 0.0)
    engine.step(0.0)
    result = engine.offload(session_ids=["s", "unknown"], block_hashes=[12345], now=0.1)
    assert (result.in_use, result.not_resident, result.freed) == (4, 1, 0)


def test_offload_by_block_hash_and_residency() -> None:
    engine = offload_engine(cpu_offload_blocks=2, disk_offload_blocks=10)
    run(engine, [Arrival(0.0, req("a", 96, session="s"))])
    blocks = engine.session_blocks("s")
    assert len(blocks) == 6
    result = engine.offload(block_hashes=blocks[3:], now=1.0)
    assert result.offloaded == 3
    assert result.transfer_seconds > 0
    r = engine.residency("s")
    assert (r.gpu, r.cpu, r.disk, r.missing) == (3, 2, 1, 0)
    assert engine.block_location(blocks[3]) == "cpu"  # heads are kept in the faster tier
    assert engine.block_location(blocks[5]) == "disk"


def test_offload_on_evict_keeps_evicted_blocks_in_the_cpu_tier() -> None:
    engine = Engine(
        EngineConfig(
            profile="fast", num_gpu_blocks=20, cpu_offload_blocks=100, offload_on_evict=True
        )
    )
    run(engine, [Arrival(0.0, req("a", 160, family=1))])
    run(engine, [Arrival(0.0, req("b", 160, family=2))])  # evicts part of a
    stats = engine.stats(1.0)
    assert stats.evicted_blocks > 0
    assert stats.cpu_offload_blocks_used == stats.evicted_blocks == stats.offloaded_blocks
    out = run(engine, [Arrival(0.0, req("c", 160, family=1))])
    assert out.first_tokens["c"] == (160 - 1) // BS * BS


def test_output_blocks_are_cached_for_the_next_turn() -> None:
    engine = Engine(EngineConfig(profile="fast", num_gpu_blocks=200))
    prompt, output = 40, 60
    ids = list(range(prompt + output))
    from kvgate.engine.blocks import chain_hashes

    full = chain_hashes(ids, BS)
    first = EngineRequest(
        "t1", full[: prompt // BS], prompt, output, "s", output_block_hashes=full[prompt // BS :]
    )
    run(engine, [Arrival(0.0, first)])
    # The last output token's KV is never computed, so the last full block may not be.
    computed_blocks = (prompt + output - 1) // BS
    second = EngineRequest("t2", full, prompt + output + 30, 5, "s")
    out = run(engine, [Arrival(0.0, second)])
    assert out.first_tokens["t2"] == computed_blocks * BS


def test_session_tracking_is_bounded_and_lru() -> None:
    engine = Engine(EngineConfig(profile="fast", num_gpu_blocks=200, max_tracked_sessions=2))
    for i, session in enumerate(["a", "b", "a", "c"]):
        engine.submit(req(f"r{i}", 32, session=session), 0.0)
    assert engine.session_ids() == ["a", "c"]
    assert engine.session_blocks("b") == []


def test_cached_prefix_tokens_probe_has_no_side_effects() -> None:
    engine = Engine(EngineConfig(profile="fast", num_gpu_blocks=200))
    r = req("a", 100)
    assert engine.cached_prefix_tokens(r.block_hashes, 100) == 0
    run(engine, [Arrival(0.0, r)])
    before = engine.stats(1.0)
    assert engine.cached_prefix_tokens(r.block_hashes, 100) == 96
    assert engine.stats(1.0) == before


def test_prefix_caching_off_never_hits() -> None:
    engine = Engine(EngineConfig(profile="fast", num_gpu_blocks=200, enable_prefix_caching=False))
    out = run(engine, [Arrival(0.0, req("a", 100)), Arrival(1.0, req("b", 100))])
    assert out.first_tokens == {"a": 0, "b": 0}
    assert engine.stats(out.end).gpu_blocks_cached == 0


def test_reset_prefix_cache() -> None:
    engine = Engine(EngineConfig(profile="fast", num_gpu_blocks=200))
    run(engine, [Arrival(0.0, req("a", 100))])
    assert engine.reset_prefix_cache() == 100 // BS
    assert engine.stats(1.0).gpu_blocks_cached == 0


def test_restore_survives_evictions_offloaded_into_the_same_tier() -> None:
    # Regression: room made for restored blocks evicts GPU blocks into the CPU
    # tier, which must not push out the blocks being restored.
    cfg = EngineConfig(
        profile="fast", num_gpu_blocks=6, cpu_offload_blocks=2, offload_on_evict=True
    )
    engine = Engine(cfg)
    run(engine, [Arrival(0.0, req("a1", 48, 1, family=1, session="a"))])
    engine.offload(session_ids=["a"], now=1.0)
    run(engine, [Arrival(0.0, req("b", 80, 1, family=2))])
    out = run(engine, [Arrival(0.0, req("a2", 48, 1, family=1, session="a"))])
    assert out.first_tokens["a2"] == 2 * BS
    assert engine.stats(out.end).restored_blocks == 2


def test_gpu_utilisation_is_reported_while_a_step_runs() -> None:
    engine = Engine(EngineConfig(profile="h100-llama3-8b", num_gpu_blocks=1000))
    engine.submit(req("a", 2000, 2), 0.0)
    duration = engine.step(0.0).duration
    assert 0.0 < engine.stats(duration / 2).gpu_utilisation <= 1.0
    assert engine.stats(duration * 2).gpu_utilisation == 0.0


def test_adopted_blocks_are_hit_and_forgotten_ones_are_not() -> None:
    # llama.cpp's slot restore and overwrite, as the emulated worker uses them.
    engine = Engine(EngineConfig(profile="fast", num_gpu_blocks=8, block_size=BS))
    chain = prompt_hashes(5, 64, 0, 64, BS)
    assert engine.cached_prefix_tokens(chain, 80) == 0
    assert engine.adopt(chain) == 4
    assert engine.cached_prefix_tokens(chain, 80) == 64
    assert engine.stats(0.0).gpu_blocks_in_use == 0  # cached, evictable, held by nobody
    assert engine.forget(chain[2:]) == 2
    assert engine.cached_prefix_tokens(chain, 80) == 32
    # A chain longer than the GPU stops where no room is left.
    assert engine.adopt(prompt_hashes(6, 160, 0, 160, BS)) == 8


@pytest.mark.parametrize(("tokens", "cached_first"), [(100, False), (5_000, False), (5_000, True)])
def test_a_lone_request_takes_exactly_its_alone_ttft(tokens: int, cached_first: bool) -> None:
    """``alone_ttft`` (the simulator's TTFT floor) is what the engine itself takes for a
    request alone on an idle engine: chunked prefill of its uncached tokens, cold or
    behind a prefix an earlier request left cached."""
    engine = Engine(EngineConfig(profile="h100-llama3-8b", num_gpu_blocks=2_000))
    arrivals = []
    if cached_first:  # the same prompt's first 4,000 tokens, done before the request
        first = EngineRequest("first", prompt_hashes(0, 4_000, 0, 4_000, BS), 4_000, 1)
        arrivals.append(Arrival(0.0, first))
    arrivals.append(Arrival(100.0, req("lone", tokens, out=2)))
    done = run(engine, arrivals).finished["lone"]
    assert done.cached_tokens == (4_000 if cached_first else 0)
    ttft = done.first_token_time - 100.0
    floor = engine.alone_ttft(tokens, done.cached_tokens)
    assert ttft == pytest.approx(floor, rel=1e-9)
    chunks = -(-(tokens - done.cached_tokens) // engine.config.max_batched_tokens)
    assert floor > chunks * engine.config.latency.step_base_s
