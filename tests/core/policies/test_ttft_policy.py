"""Table tests of the ttft policy: predicted TTFT plus eviction cost, sessions, replicas.

With the priors (12,000 prefill tokens/s, 4 characters a token) one 256-character
block costs 64 tokens = 5.33 ms of prefill; ``queue(policy, worker, seconds)``
gives a worker that much queued prefill at time 0.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvgate.core.fleet import Health, Pressure
from kvgate.core.policies.ttft import TtftConfig, TtftPolicy
from kvgate.core.speed import FleetSpeed, Observation, Speed

from .tables import THREE, chain, ctx, fleet, queue, request, with_loads, worker


@pytest.mark.parametrize(
    ("workers", "bound_to", "chosen", "reason"),
    [
        (with_loads(a=2, b=0, c=0), "a", "a", "affinity_hit"),
        # Soft pressure keeps an affine session.
        ((replace(THREE[0], pressure=Pressure.SOFT), *THREE[1:]), "a", "a", "affinity_hit"),
        # Its home full: it must leave.
        (with_loads(a=256, b=0, c=0), "a", None, "affinity_overloaded_migrated"),
        (
            (replace(THREE[0], health=Health.DRAINING), *THREE[1:]),
            "a",
            None,
            "affinity_lost_migrated",
        ),
        (
            (replace(THREE[0], pressure=Pressure.HARD), *THREE[1:]),
            "a",
            None,
            "affinity_pressure_migrated",
        ),
    ],
)
def test_explicit_sessions_keep_their_stickiness(
    workers: tuple, bound_to: str, chosen: str | None, reason: str
) -> None:
    policy = TtftPolicy()
    policy.on_routed(request("t1", session="s", hashes=chain(1, 4)), bound_to, -10.0)
    decision = policy.pick(
        request("t2", session="s", hashes=chain(1, 4)), ctx(fleet(*workers), bound_to)
    )
    assert decision.reason == reason
    if chosen is not None:
        assert decision.worker == chosen
        assert decision.affinity is None
    else:
        assert decision.worker not in (None, "a")
        assert decision.affinity is not None
        assert decision.affinity.expected == "a"
        assert decision.affinity.worker == decision.worker


def test_a_busy_session_stays_where_leaving_would_recompute_more() -> None:
    """A session moves only if recomputing its history elsewhere is predicted quicker."""
    policy = TtftPolicy()
    history = chain(1, 60)  # 60 blocks cached on a: 320 ms to recompute elsewhere
    policy.on_routed(request("t1", session="s", hashes=history), "a", -10.0)
    workers = with_loads(a=14, b=0, c=0)  # 28 ms of decode steps ahead at a
    decision = policy.pick(
        request("t2", session="s", hashes=(*history, 7)), ctx(fleet(*workers), "a")
    )
    assert (decision.worker, decision.reason, decision.affinity) == ("a", "affinity_hit", None)
    # Behind a second of queued prefill at home, recomputing 320 ms elsewhere is faster.
    queue(policy, "a", 1.0)
    moved = policy.pick(request("t3", session="s", hashes=(*history, 8)), ctx(fleet(*workers), "a"))
    assert (moved.worker, moved.reason) == ("b", "affinity_overloaded_migrated")
    assert moved.affinity is not None and moved.affinity.expected == "a"


def test_headerless_requests_are_never_bound() -> None:
    decision = TtftPolicy().pick(request(hashes=chain(1, 4)), ctx(fleet(*THREE)))
    assert decision.worker is not None and decision.affinity is None


def test_a_warm_worker_is_left_when_its_queue_outweighs_its_cache() -> None:
    policy = TtftPolicy()
    policy.on_routed(request("w", hashes=chain(1, 8)), "c", -10.0)  # 43 ms of prefill held
    warm = policy.pick(request("r1", hashes=(*chain(1, 8), 9)), ctx(fleet(*THREE)))
    assert (warm.worker, warm.reason) == ("c", "prefix_match")
    queue(policy, "c", 0.2)
    cold = policy.pick(request("r2", hashes=(*chain(1, 8), 9)), ctx(fleet(*THREE)))
    assert (cold.worker, cold.reason) == ("a", "least_ttft")


def observe(policy: TtftPolicy, where: str, n: int, tokens_per_s: float, at: float) -> float:
    """``n`` one-at-a-time uncached requests served by ``where`` at ``tokens_per_s``."""
    for i in range(n):
        features = request(f"{where}-{at}-{i}", hashes=(hash((where, at, i)),), prompt_chars=4000)
        policy.on_routed(features, where, at)
        ttft = 1000 / tokens_per_s
        policy.on_usage(features, where, 1000, 0, at + ttft)
        policy.on_observed(features, where, Observation(ttft, 1000, 0), at + ttft)
        at += ttft + 0.001
    return at


def test_a_slow_worker_is_learned_and_gets_less_work() -> None:
    """Priors say the three are alike; observations say c prefills at a third of the rate."""
    policy = TtftPolicy()
    at = observe(policy, "a", 30, 12_000, 0.0)
    at = observe(policy, "b", 30, 12_000, at)
    at = observe(policy, "c", 30, 4_000, at)
    speeds = policy.speeds()
    assert speeds["c"].speed.prefill_s > 2 * speeds["a"].speed.prefill_s
    assert speeds["a"].ttft_error is not None and speeds["a"].observations == 30
    # One request queued on a (about 83 ms): a still beats c for a 1,000-token prompt.
    queue(policy, "a", 0.08)
    snapshot = fleet(*THREE, now=at)
    decision = policy.pick(request("x", hashes=(77,), prompt_chars=4000), ctx(snapshot))
    assert decision.worker == "b"
    prior = TtftPolicy(TtftConfig(learn=False))
    observe(prior, "c", 30, 4_000, 0.0)
    assert prior.speed.speed("c") == prior.speed.prior


def test_the_engines_own_queue_counts_other_replicas_work() -> None:
    workers = (replace(THREE[0], waiting=6, running=2), *THREE[1:])
    seeing = TtftPolicy(TtftConfig(engine_queue=True))
    chosen = seeing.pick(request(hashes=chain(1, 4)), ctx(fleet(*workers)))
    assert chosen.worker != "a"
    blind = TtftPolicy()
    assert blind.pick(request(hashes=chain(1, 4)), ctx(fleet(*workers))).worker == "a"


def fill_with_reuse(policy: TtftPolicy, where: str) -> None:
    """``where``'s cache full of chains that later requests hit."""
    blocks = policy.index.config.default_worker_blocks
    for n in range(8):
        features = request(f"{where}{n}", hashes=chain(300 + n, blocks // 8))
        policy.on_routed(features, where, -10.0)
        policy.on_usage(features, where, 1000, 900, -9.0)


def test_new_work_goes_where_it_evicts_nothing_anyone_would_hit() -> None:
    policy = TtftPolicy()
    fill_with_reuse(policy, "a")
    assert policy.index.fill("a") > 0.5
    two = (THREE[0], THREE[1])
    chosen = policy.pick(request("n", hashes=chain(9, 16)), ctx(fleet(*two)))
    assert chosen.worker == "b"
    # With b's cache full of KV reserved for sessions coming back, a is cheaper.
    fill_with_reuse(policy, "b")
    policy.reserved = {"b": 1.0}
    assert policy.pick(request("m", hashes=chain(10, 16)), ctx(fleet(*two))).worker == "a"


def test_workers_at_kv_high_are_skipped_while_another_is_below() -> None:
    workers = (replace(THREE[0], kv_usage=0.95), replace(THREE[1], kv_usage=0.5, in_flight=3))
    assert TtftPolicy().pick(request(hashes=chain(1, 4)), ctx(fleet(*workers))).worker == "b"


def test_time_scale_puts_the_priors_on_the_drivers_clock() -> None:
    """An emulated fleet at time scale 10 prefills 12,000 model tokens in 0.1 real s."""
    policy = TtftPolicy(TtftConfig(time_scale=10.0, overhead_s=0.0))
    assert policy.speed.predict("a", 12_000, 0.0) == pytest.approx(0.1)


def test_hold_worth_is_the_lead_of_the_chosen_worker() -> None:
    policy = TtftPolicy()
    queue(policy, "b", 0.1)
    queue(policy, "c", 0.3, "other")
    features = request("r", hashes=chain(1, 4))
    context = ctx(fleet(*THREE))
    decision = policy.pick(features, context)
    assert decision.worker == "a"
    assert policy.hold_worth(features, "a", context) == pytest.approx(0.1, abs=0.01)
    assert policy.hold_worth(features, "b", context) == 0.0


@pytest.mark.parametrize(("delay_cap", "chosen"), [(2.0, "a"), (0.0, "b")])
def test_on_a_backlogged_fleet_a_sibling_stays_behind_its_groups_prompt(
    delay_cap: float, chosen: str
) -> None:
    """A burst: every worker has a queue. Recomputing the group's 2,048-token prompt on b
    would start this request sooner, but it is capacity the requests queued behind on b
    wait for: counted (``delay_cap``), the sibling stays on a, where the prompt is."""
    policy = TtftPolicy(TtftConfig(delay_cap=delay_cap))
    group = chain(1, 32)
    policy.on_routed(request("opener", hashes=group), "a", 0.0)
    for i in range(16):  # the burst: many arrivals at once
        queue(policy, "abc"[i % 3], 0.02, f"burst{i}")
    queue(policy, "a", 0.25, "long")
    sibling = request("sibling", hashes=(*group, 99), prompt_chars=32 * 256 + 256)
    assert policy.pick(sibling, ctx(fleet(*THREE))).worker == chosen


def test_a_claim_older_than_a_kv_turnover_counts_as_evicted() -> None:
    """The index remembers four KV capacities; past one and a half sent after a chain, the
    engine's LRU has likely evicted it: a TTFT predicted on it would miss the recompute."""
    workers = tuple(replace(w, kv_capacity_tokens=2048) for w in THREE)  # 32 blocks each
    for fillers, expected in ((0, ("c", "prefix_match")), (8, ("a", "least_loaded"))):
        policy = TtftPolicy()
        policy.index.set_kv_capacity("c", 2048)
        policy.on_routed(request("w", hashes=chain(1, 8)), "c", -10.0)
        for i in range(fillers):  # 64 blocks sent to c after it, each answered
            filler = request(f"f{i}", hashes=chain(100 + i, 8))
            policy.on_routed(filler, "c", -10.0)
            policy.on_usage(filler, "c", 512, 0, -9.0)
        assert policy.index.match(chain(1, 8)).get("c") == 8  # still claimed
        decision = policy.pick(request("r", hashes=(*chain(1, 8), 9)), ctx(fleet(*workers)))
        assert (decision.worker, decision.reason) == expected


def test_a_kept_look_predicts_what_predict_does() -> None:
    """``ttft`` costs every candidate from its ``Look`` (kept until the worker's book
    changes or a request's predicted start): the same TTFT as ``FleetSpeed.predict``."""
    speed = FleetSpeed(Speed(0.005, 1 / 12_000, 0.005), fitted=(True, True, False, False))
    speed.sent("a1", "a", 0.0, 3000)
    speed.sent("a2", "a", 0.0, 1000)
    speed.first_token("a1", 0.1)
    look = speed.look("a", 0.1)
    for now in (0.1, 0.15, 0.3, 1.0):
        if now >= look.until:
            look = speed.look("a", now)
        sp, queued = look.speed, look.queued(now) if look.unstarted else 0.0
        decoding = max(look.decoding, 3 - look.unstarted)
        mine = (
            sp.overhead_s
            + sp.prefill_s * (queued + 500)
            + sp.decode_s * decoding
            + sp.queue_s * look.unstarted
        )
        assert mine == pytest.approx(speed.predict("a", 500, now, in_flight=3))


def test_on_an_engine_of_slots_a_shared_prefix_is_not_cached_in_a_cold_free_slot() -> None:
    """llama.cpp: each slot keeps its own KV, so a request that finds a free slot that has
    served nothing recomputes a prefix another slot there holds: it goes to the idle
    worker, and is booked uncached where it goes."""
    policy = TtftPolicy()
    workers = (worker("a", slots=4), worker("b", slots=4))
    first = request("r1", hashes=chain(1, 16, tail=1))
    policy.pick(first, ctx(fleet(*workers)))
    policy.on_routed(first, "a", 0.0)
    second = request("r2", hashes=chain(1, 16, tail=2))
    assert policy.pick(second, ctx(fleet(*workers, now=0.1))).worker == "b"
    # Without slots, the prefix held on ``a`` keeps the second there.
    plain = TtftPolicy()
    plain.on_routed(first, "a", 0.0)
    assert plain.pick(second, ctx(fleet(worker("a"), worker("b"), now=0.1))).worker == "a"


def test_what_the_slot_plane_counts_in_the_engines_tokens_is_booked_as_it_says() -> None:
    """``slot_uncached`` (llama.cpp's slot plane, from the session's last turn's usage) is
    what ``ttft`` books on the worker it names; elsewhere its own guess stands."""
    policy = TtftPolicy()
    turn = replace(request("r1", session="s", hashes=chain(1, 16)), slot_uncached=(("a", 69, 0.0),))
    policy.on_routed(turn, "a", 0.0)
    policy.on_routed(replace(turn, request_id="r2"), "b", 0.0)
    assert policy.speed.books["a"].sent["r1"].uncached == pytest.approx(69.0)
    assert policy.speed.books["b"].sent["r2"].uncached == pytest.approx(1024.0)
