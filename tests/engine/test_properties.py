"""Properties that hold for any sequence of requests (hypothesis)."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgate.engine import Engine, EngineConfig, EngineRequest, StepResult
from kvgate.engine.profiles import PROFILES

from .drive import Arrival, Outcome, prompt_hashes, run

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_PROMPT = 96
MAX_OUTPUT = 40


@st.composite
def requests(draw: st.DrawFn, bs: int, n_max: int = 14) -> list[Arrival]:
    """Arrivals from a few prefix families, some aborted, some in the same session."""
    n = draw(st.integers(1, n_max))
    arrivals = []
    t = 0.0
    for i in range(n):
        family = draw(st.integers(0, 3))
        tokens = draw(st.integers(1, MAX_PROMPT))
        shared = draw(st.integers(0, tokens))
        hashes = prompt_hashes(family, shared, i, tokens, bs)
        out = draw(st.integers(1, MAX_OUTPUT))
        t += draw(st.sampled_from([0.0, 0.0001, 0.0005, 0.002]))
        abort = draw(st.one_of(st.none(), st.sampled_from([0.0, 0.0002, 0.001])))
        request = EngineRequest(f"r{i}", hashes, tokens, out, session_id=f"s{family}")
        arrivals.append(Arrival(t, request, abort))
    return arrivals


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[EngineConfig, list[Arrival]]:
    bs = draw(st.sampled_from([4, 16]))
    largest = -(-(MAX_PROMPT + MAX_OUTPUT) // bs)
    config = EngineConfig(
        profile="fast",
        block_size=bs,
        num_gpu_blocks=largest + draw(st.integers(0, 3 * largest)),
        max_num_seqs=draw(st.integers(1, 6)),
        max_batched_tokens=draw(st.sampled_from([8, 32, 128])),
        preemption=draw(st.booleans()),
        enable_prefix_caching=draw(st.sampled_from([True, True, True, False])),
        cpu_offload_blocks=draw(st.sampled_from([0, 4, 20])),
        disk_offload_blocks=draw(st.sampled_from([0, 8])),
        offload_on_evict=draw(st.booleans()),
    )
    return config, draw(requests(bs))


def check_invariants(engine: Engine, result: StepResult) -> None:
    """White-box consistency of the block pool with the live sequences."""
    scheduler = engine._scheduler
    pool = scheduler.pool
    config = engine.config
    assert pool.num_free >= 0
    assert pool.num_in_use <= pool.capacity
    assert 0 <= pool.reserved <= pool.num_free + pool.num_evictable
    assert 0.0 <= engine.kv_usage <= 1.0
    assert len(scheduler.running) <= config.max_num_seqs
    held: Counter[int] = Counter()
    private = 0
    for seq in scheduler.sequences.values():
        held.update(seq.held)
        private += seq.num_blocks - len(seq.held)
        assert seq.num_blocks * config.block_size >= seq.computed
        assert seq.cached_tokens <= seq.prompt
    assert private == pool.private
    assert {h: c for h, c in pool.refs.items() if c} == dict(held)
    for rid, cached in result.first_tokens:
        seq = scheduler.sequences.get(rid)
        finished = [f for f in result.finished if f.request_id == rid]
        prompt = seq.prompt if seq is not None else finished[0].prompt_tokens
        assert 0 <= cached <= prompt
    if not config.preemption:
        assert not result.preempted


def assert_complete(arrivals: list[Arrival], out: Outcome, engine: Engine) -> None:
    """No lost requests: each finished with all its tokens, or was aborted."""
    ids = {a.request.request_id for a in arrivals}
    assert set(out.finished) | out.aborted == ids
    assert not set(out.finished) & out.aborted
    by_id = {a.request.request_id: a.request for a in arrivals}
    for rid, fin in out.finished.items():
        assert fin.output_tokens == by_id[rid].max_tokens == out.tokens[rid]
        assert 0 <= fin.cached_tokens <= fin.prompt_tokens
        assert fin.arrival <= fin.first_token_time <= fin.finish_time
    assert not engine.has_work()
    assert engine.stats(out.end).gpu_blocks_in_use == 0
    assert engine._scheduler.pool.reserved == 0


@FAST
@given(scenarios())
def test_any_workload_keeps_invariants_and_loses_nothing(
    scenario: tuple[EngineConfig, list[Arrival]],
) -> None:
    config, arrivals = scenario
    engine = Engine(config)
    step_count = [0]

    def check(e: Engine, result: StepResult) -> None:
        check_invariants(e, result)
        step_count[0] += 1
        if step_count[0] % 7 == 0:  # an operator offloading idle sessions now and then
            e.offload(session_ids=[f"s{step_count[0] % 4}"], now=0.0)

    out = run(engine, arrivals, horizon=0.01, check=check)
    assert_complete(arrivals, out, engine)
    stats = engine.stats(out.end)
    assert stats.preemptions == len(out.preempted)
    assert stats.requests_finished + stats.requests_aborted == len(arrivals)


@FAST
@given(scenarios())
def test_same_inputs_give_same_outputs(scenario: tuple[EngineConfig, list[Arrival]]) -> None:
    config, arrivals = scenario
    first, second = Engine(config), Engine(config)
    a = run(first, arrivals, horizon=0.01)
    b = run(second, arrivals, horizon=0.01)
    assert a == b
    assert first.stats(a.end) == second.stats(b.end)


@FAST
@given(scenarios())
def test_fusing_decode_steps_changes_no_outcome(
    scenario: tuple[EngineConfig, list[Arrival]],
) -> None:
    config, arrivals = scenario
    # All at once and never aborted: no event can fall inside a fused run.
    at_once = [Arrival(0.0, a.request) for a in arrivals]
    single = run(Engine(config), at_once)
    fused = run(Engine(config), at_once, horizon=1e9)
    assert fused.tokens == single.tokens
    assert fused.first_tokens == single.first_tokens
    assert fused.preempted == single.preempted
    assert fused.steps == single.steps
    for rid, fin in single.finished.items():
        assert abs(fused.finished[rid].finish_time - fin.finish_time) < 1e-9


@FAST
@given(
    bs=st.sampled_from([1, 4, 16]),
    tokens=st.integers(1, 300),
    out=st.integers(1, 20),
    shared=st.integers(0, 300),
)
def test_a_prompt_served_twice_with_room_hits_the_second_time(
    bs: int, tokens: int, out: int, shared: int
) -> None:
    blocks = -(-(tokens + out) // bs)
    engine = Engine(EngineConfig(profile="fast", block_size=bs, num_gpu_blocks=3 * blocks))
    hashes = prompt_hashes(1, min(shared, tokens), 0, tokens, bs)
    run(engine, [Arrival(0.0, EngineRequest("a", hashes, tokens, out))])
    second = run(engine, [Arrival(0.0, EngineRequest("b", hashes, tokens, out))])
    assert second.first_tokens["b"] == (tokens - 1) // bs * bs


@FAST
@given(
    bs=st.sampled_from([2, 4]),
    capacity_extra=st.integers(0, 40),
    prompts=st.lists(
        st.tuples(st.integers(0, 4), st.integers(1, 48), st.integers(1, 12)),
        min_size=1,
        max_size=12,
    ),
)
def test_eviction_is_least_recently_used(
    bs: int, capacity_extra: int, prompts: list[tuple[int, int, int]]
) -> None:
    capacity = -(-(48 + 12) // bs) + capacity_extra
    engine = Engine(
        EngineConfig(profile="fast", block_size=bs, num_gpu_blocks=capacity, max_batched_tokens=64)
    )
    lru: list[int] = []  # reference model: cached blocks, next to be evicted first
    for i, (family, tokens, out) in enumerate(prompts):
        chain = prompt_hashes(family, tokens, 0, tokens, bs)
        limit = (tokens - 1) // bs
        hit = 0
        while hit < limit and chain[hit] in lru:
            hit += 1
        present = [h for h in chain if h in lru]
        lru = [h for h in lru if h not in present]
        physical = -(-(tokens + out - 1) // bs) - len(present)
        evicted = max(0, physical - (capacity - len(lru) - len(present)))
        lru = lru[evicted:] + chain[::-1]

        result = run(engine, [Arrival(0.0, EngineRequest(f"r{i}", chain, tokens, out))])
        assert result.first_tokens[f"r{i}"] == hit * bs
        assert engine._scheduler.pool.evictable_hashes() == lru


@FAST
@given(
    profile=st.sampled_from(["h100-llama3-8b", "a100-llama3-8b", "cpu-small"]),
    tier=st.sampled_from(["cpu", "disk"]),
    tokens=st.integers(33, 600),
)
def test_offloaded_blocks_return_faster_than_recomputation(
    profile: str, tier: str, tokens: int
) -> None:
    bs = 16
    hashes = prompt_hashes(1, tokens, 0, tokens, bs)

    def second_ttft(offload_blocks: int) -> float:
        cfg = EngineConfig(
            profile=profile,
            block_size=bs,
            num_gpu_blocks=200,
            cpu_offload_blocks=offload_blocks if tier == "cpu" else 0,
            disk_offload_blocks=offload_blocks if tier == "disk" else 0,
        )
        engine = Engine(cfg)
        run(engine, [Arrival(0.0, EngineRequest("a", hashes, tokens, 2, "s"))])
        engine.offload(session_ids=["s"], now=10.0)
        out = run(engine, [Arrival(0.0, EngineRequest("b", hashes, tokens, 2, "s"))])
        return out.finished["b"].ttft

    assert PROFILES[profile].prefill_tokens_per_s > 0
    assert second_ttft(100) < second_ttft(0)
