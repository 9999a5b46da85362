"""The speed estimator: converges from its prior, follows a slowdown, ignores outliers."""

from __future__ import annotations

import heapq
import math
import random
import statistics

import pytest

from kvgate.core.speed import FleetSpeed, Speed
from kvgate.core.speed_fit import _bound

PRIOR = Speed(overhead_s=0.01, prefill_s=1 / 12_000, decode_s=0.002)


def drive(
    model: FleetSpeed,
    truth: Speed,
    rng: random.Random,
    n: int,
    *,
    worker: str = "w",
    start: float = 0.0,
    outliers: float = 0.0,
) -> float:
    """Send ``n`` requests one after another (each waits for the last), as a worker of speed
    ``truth`` would serve them; returns the time after the last."""
    now = start
    for i in range(n):
        rid = f"{worker}-{start}-{i}"
        prompt = rng.randint(100, 4000)
        cached = rng.randint(0, prompt // 2)
        running = 0
        model.sent(rid, worker, now, prompt - cached)
        ttft = truth.ttft(prompt - cached, running) * rng.uniform(0.95, 1.05)
        if rng.random() < outliers:
            ttft *= 20
        model.first_token(rid, now + ttft)
        model.ended(rid, prompt, cached)
        model.observed(rid, ttft)
        now += ttft + 0.01
    return now


def close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * abs(b)


def test_converges_from_the_prior_within_a_few_dozen_requests() -> None:
    truth = Speed(overhead_s=0.03, prefill_s=1 / 4_000, decode_s=0.002)
    model = FleetSpeed(PRIOR)
    drive(model, truth, random.Random(1), 40)
    got = model.speed("w")
    assert close(got.prefill_s, truth.prefill_s, 0.15)
    assert close(model.predict("w", 2000, 1e9), truth.ttft(2000, 0), 0.1)
    report = model.report()["w"]
    assert report.observations == 40 and report.ttft_error is not None


def test_follows_a_worker_that_slows_down_and_shrugs_off_outliers() -> None:
    fast = Speed(overhead_s=0.02, prefill_s=1 / 10_000, decode_s=0.002)
    slow = Speed(overhead_s=0.04, prefill_s=2 / 10_000, decode_s=0.004)
    model = FleetSpeed(PRIOR)
    rng = random.Random(2)
    now = drive(model, fast, rng, 60, outliers=0.05)
    assert close(model.speed("w").prefill_s, fast.prefill_s, 0.2)
    drive(model, slow, rng, 40, start=now)
    assert close(model.predict("w", 2000, 1e9), slow.ttft(2000, 0), 0.2)


def test_a_new_worker_gets_the_fleets_estimate() -> None:
    truth = Speed(overhead_s=0.02, prefill_s=1 / 5_000, decode_s=0.002)
    model = FleetSpeed(PRIOR)
    rng = random.Random(3)
    for w in ("a", "b", "c"):
        drive(model, truth, rng, 30, worker=w)
    assert model.speed("new") == model.fleet()
    assert close(model.fleet().prefill_s, truth.prefill_s, 0.2)
    assert model.speed("new") != PRIOR


def test_queue_ahead_counts_what_has_not_started_and_the_engines_others() -> None:
    model = FleetSpeed(PRIOR)
    model.sent("a", "w", 0.0, 12_000)  # one second of prefill ahead, half done at 0.5
    assert model.queue("w", 0.5) == (pytest.approx(6_000), 0)
    alone = PRIOR.ttft(1200, 0)
    assert model.predict("w", 1200, 0.5) == pytest.approx(PRIOR.ttft(7_200, 0))
    model.first_token("a", 0.6)
    assert model.queue("w", 0.7) == (0, 1)
    assert model.predict("w", 1200, 0.7) == pytest.approx(PRIOR.ttft(1200, 1))
    # The engine sees three waiting that are not ours: another replica's work.
    assert model.predict("w", 1200, 0.7, waiting=3, running=1) > alone
    model.dropped("a")
    assert model.queue("w", 0.7) == (0, 0)
    # Past its predicted first token, an unreported request counts as started.
    model.sent("b", "w", 1.0, 1200)
    assert model.queue("w", 100.0) == (0, 1)


def test_queued_requests_teach_the_per_token_rate() -> None:
    """TTFT behind a queue: the fit counts the tokens ahead, so the rate comes out right."""
    truth = Speed(overhead_s=0.01, prefill_s=1 / 8_000, decode_s=0.0)
    model = FleetSpeed(PRIOR)
    rng = random.Random(4)
    now = 0.0
    for i in range(30):
        burst = [f"r{i}-{k}" for k in range(3)]
        tokens = [rng.randint(500, 3000) for _ in burst]
        for rid, t in zip(burst, tokens, strict=True):
            model.sent(rid, "w", now, t)
        done = now
        for rid, t in zip(burst, tokens, strict=True):
            done += truth.ttft(t, 0)
            model.first_token(rid, done)
            model.ended(rid, t, 0)
            model.observed(rid, done - now)
        now = done + 1.0
    assert close(model.speed("w").prefill_s, truth.prefill_s, 0.15)


def test_the_queue_ahead_drains_at_the_workers_rate_and_restarts_at_each_first_token() -> None:
    """An engine prefills its queue as it comes: a request sent while another is half done
    waits for the other half only. A first token later than the drain says means the rest
    is still all to do."""
    model = FleetSpeed(PRIOR)
    model.sent("a", "w", 0.0, 6_000)  # half a second
    model.sent("b", "w", 0.25, 1_200)  # a quarter second of a's left
    assert model.queue("w", 0.25) == (pytest.approx(3_000 + 1_200), 0)
    assert model.queue("w", 10.0)[0] == 0.0  # all drained by the rate (and past b's start)
    model = FleetSpeed(PRIOR)
    model.sent("a", "w", 0.0, 6_000)
    model.sent("b", "w", 0.0, 6_000)
    model.first_token("a", 1.5)  # the worker is slower than thought: b is all still to do
    assert model.queue("w", 1.5) == (pytest.approx(6_000), 1)
    assert model.predict("w", 1_200, 1.5) == pytest.approx(PRIOR.ttft(7_200, 1))


def serve_fcfs(truth: Speed, rng: random.Random, n: int, model: FleetSpeed) -> list[float]:
    """Poisson arrivals at a worker that prefills one request after another (first come,
    first served, at ``truth``'s rate; its overhead on top, not holding the worker), each
    event told in time order: each prediction's relative error, in order."""
    now = free = 0.0
    errors = []
    pending: list[tuple[float, str, float, int]] = []  # first token at, id, sent at, tokens

    def until(t: float) -> None:
        while pending and pending[0][0] <= t:
            first, rid, at, tokens = heapq.heappop(pending)
            model.first_token(rid, first)
            model.ended(rid, tokens, 0)
            model.observed(rid, first - at)

    for i in range(n):
        now += rng.expovariate(1.0 / 0.15)  # ~60% busy at ~1,100 tokens a request
        until(now)
        tokens = rng.randint(200, 2_000)
        predicted = model.sent(f"r{i}", "w", now, tokens)
        free = max(free, now) + truth.prefill_s * tokens
        first = free + truth.overhead_s
        heapq.heappush(pending, (first, f"r{i}", now, tokens))
        errors.append(abs(predicted - (first - now)) / (first - now))
    until(float("inf"))
    return errors


def test_predicts_a_busy_fcfs_worker_within_a_few_percent_once_warm() -> None:
    truth = Speed(overhead_s=0.02, prefill_s=1 / 8_000, decode_s=0.0)
    errors = serve_fcfs(truth, random.Random(5), 300, FleetSpeed(PRIOR))
    assert statistics.median(errors[100:]) < 0.05


def test_a_prior_a_hundred_times_off_is_rescaled_at_the_first_observations() -> None:
    """A CPU engine behind an H100 prior: the first observation rescales the prior, and a
    worker not yet warm is predicted with the fleet's estimate of those seen at all."""
    truth = Speed(overhead_s=0.3, prefill_s=1 / 150, decode_s=0.05)
    model = FleetSpeed(PRIOR)
    rng = random.Random(7)
    now, errors = 0.0, []
    for i in range(16):
        tokens = rng.randint(100, 1_500)
        predicted = model.sent(f"r{i}", "a", now, tokens)
        ttft = truth.ttft(tokens, 0) * rng.uniform(0.95, 1.05)
        model.first_token(f"r{i}", now + ttft)
        model.ended(f"r{i}", tokens, 0)
        model.observed(f"r{i}", ttft)
        errors.append(abs(predicted - ttft) / ttft)
        now += ttft + 1.0
    assert errors[0] > 0.9  # the prior's
    assert statistics.median(errors[1:]) < 0.15
    assert close(model.speed("b").prefill_s, truth.prefill_s, 0.2)  # never seen: the fleet's


def test_a_queue_the_prior_never_saw_is_learned_after_a_rescale() -> None:
    """Requests waiting for a slot (llama.cpp): each one waiting ahead adds seconds, where
    the prior's queueing is nought; a rescale gives that parameter room to move."""
    model = FleetSpeed(PRIOR)
    errors: list[float] = []
    for burst in range(12):
        start = burst * 100.0
        rids = [f"b{burst}-{k}" for k in range(6)]
        predicted = [model.sent(rid, "w", start, 200) for rid in rids]
        for k, rid in enumerate(rids):
            ttft = 1.0 + 5.0 * k  # each one waits for the slot of the one before it
            model.first_token(rid, start + ttft)
            model.ended(rid, 200, 0)
            model.observed(rid, ttft)
            errors.append(abs(predicted[k] - ttft) / ttft)
    assert model.speed("w").queue_s > 2.0
    assert statistics.median(errors[-12:]) < 0.2


def test_a_worker_within_the_tolerance_of_the_fleet_is_predicted_with_the_fleets_speed() -> None:
    """Like workers differ by their fits' noise: inside the tolerance the fleet's estimate
    predicts them all alike; a worker truly slower keeps its own."""
    like = Speed(overhead_s=0.02, prefill_s=1 / 10_000, decode_s=0.002)
    near = Speed(overhead_s=0.02, prefill_s=1 / 9_500, decode_s=0.002)
    slow = Speed(overhead_s=0.02, prefill_s=1 / 5_000, decode_s=0.002)
    for tolerance, alike in ((0.15, True), (0.0, False)):
        model = FleetSpeed(PRIOR, tolerance=tolerance, fitted=(True, True, False, False))
        rng = random.Random(5)
        for worker, truth in (("a", like), ("b", like), ("c", near), ("d", slow)):
            drive(model, truth, rng, 40, worker=worker)
        c, a = model.predict("c", 2000, 1e9), model.predict("a", 2000, 1e9)
        fleet = model.fleet().ttft(2000, 0)
        assert (c == pytest.approx(fleet)) is alike
        assert a == pytest.approx(fleet) or not alike
        assert model.predict("d", 2000, 1e9) > 1.5 * fleet


def test_a_fleet_that_observed_nothing_is_predicted_at_the_engines_own_prefill_rate() -> None:
    model = FleetSpeed(PRIOR)
    model.engine("a", None, 1 / 60)
    model.engine("b", None, 1 / 40)
    # The median of the engines' reports, not the configured 12,000 tokens/s.
    assert model.speed("a").prefill_s == pytest.approx((1 / 60 + 1 / 40) / 2)
    assert model.predict("b", 600, 0.0) == pytest.approx(PRIOR.overhead_s + 600 * (1 / 48))


def test_an_engines_slots_prefill_side_by_side_and_past_them_a_request_waits() -> None:
    model = FleetSpeed(Speed(overhead_s=0.0, prefill_s=0.01, decode_s=0.0))
    model.engine("w", 2, None)
    assert model.predict("w", 100, 0.0) == pytest.approx(1.0)  # alone: its own prefill
    model.sent("r1", "w", 0.0, 100)
    # A free slot: it prefills beside r1, sharing the batch (as many tokens of r1 as its own).
    assert model.predict("w", 100, 0.0) == pytest.approx(2.0)
    model.sent("r2", "w", 0.0, 100)
    # Past the slots: it waits for a slot, r1's once it has prefilled (1 s, in the order
    # sent) and decoded (not measured yet: 0), then prefills beside what r2 has left (1 s
    # of it: not all of r2's again, which counted r2's prefill twice).
    assert model.predict("w", 100, 0.0) == pytest.approx(1.0 + 2.0)
    for rid in ("r1", "r2"):
        model.first_token(rid, 0.0)
    model.ended("r1", 100, 0)
    model.held("r1", 9.0)  # it decoded 9 s after its first token
    model.sent("r3", "w", 0.0, 100)
    model.first_token("r3", 0.0)
    # Both slots decode since 0 s; at 4 s the first gives its slot back in 5 s.
    assert model.predict("w", 100, 4.0) == pytest.approx(5.0 + 1.0)


def test_no_slots_reported_no_slot_wait() -> None:
    model = FleetSpeed(Speed(overhead_s=0.0, prefill_s=0.01, decode_s=0.0))
    for i in range(8):
        model.sent(f"r{i}", "w", 0.0, 100)
        model.first_token(f"r{i}", 0.0)
    assert model.predict("w", 100, 0.0) == pytest.approx(1.0)


def test_an_engines_free_slot_is_cold_until_it_has_served() -> None:
    model = FleetSpeed(Speed(overhead_s=0.0, prefill_s=0.01, decode_s=0.0))
    assert model.slot_cache("w")  # no slots known: the cache is the worker's
    model.engine("w", 2, None)
    model.sent("r1", "w", 0.0, 100)
    assert not model.slot_cache("w")  # the free slot has served nothing: cold
    model.sent("r2", "w", 0.0, 100)
    assert model.slot_cache("w")  # past the slots: it takes one a request leaves, warm
    model.ended("r1", 100, 0)
    model.ended("r2", 100, 0)
    assert model.slot_cache("w")  # both slots have served


def test_a_streamed_request_late_for_its_first_token_slows_the_estimate_at_once() -> None:
    """A CPU engine behind a GPU prior: a request past its predicted first token is a
    lower bound on its TTFT (``late``), fitted seconds after the send, not at its answer."""
    model = FleetSpeed(PRIOR)
    predicted = model.sent("a", "w", 0.0, 1_000, streamed=True)
    assert not model.late(predicted)  # not yet late
    assert model.late(3.0)  # 3 s without a first token: the worker is slower than believed
    assert model.predict("w", 1_000, 3.0) > 10 * predicted
    # Checked again at twice its wait, not at every look.
    assert not model.late(3.5)
    assert model.late(6.0)
    # A non-streamed request's first token is its end: its wait says nothing alone.
    model = FleetSpeed(PRIOR)
    model.sent("b", "w", 0.0, 1_000)
    assert not model.late(3.0)
    # Nor does a request that had its first token.
    model.sent("c", "w", 0.0, 1_000, streamed=True)
    model.first_token("c", 0.05)
    assert not model.late(3.0)


def test_the_fit_keeps_overhead_under_the_ttfts_and_prefill_near_its_start() -> None:
    """TTFTs that are mostly queueing the features miss: the overhead is never fitted
    above the low TTFTs, the prefill rate never more than ``band`` from its start."""
    model = FleetSpeed(PRIOR, band=4.0)
    rng = random.Random(8)
    for i in range(200):
        tokens = rng.randint(100, 4_000)
        model.sent(f"r{i}", "w", i * 10.0, tokens)
        ttft = 0.02 + tokens * PRIOR.prefill_s + rng.choice((0.0, 0.0, 0.5, 1.0))  # queued
        model.first_token(f"r{i}", i * 10.0 + ttft)
        model.ended(f"r{i}", tokens, 0)
        model.observed(f"r{i}", ttft)
    got = model.speed("w")
    assert got.overhead_s <= 0.02 + 4_000 * PRIOR.prefill_s
    assert PRIOR.prefill_s / 4 <= got.prefill_s <= PRIOR.prefill_s * 4


def test_a_worker_without_observations_drifts_back_to_the_fleets_estimate() -> None:
    """A worker judged slow and then sent nothing is not starved for good: as the others'
    observations pass it by, its estimate returns to the fleet's, so it is tried again."""
    fast = Speed(overhead_s=0.02, prefill_s=1 / 10_000, decode_s=0.002)
    slow = Speed(overhead_s=0.02, prefill_s=1 / 3_000, decode_s=0.002)
    model = FleetSpeed(PRIOR, stale=8.0)
    rng = random.Random(9)
    now = 0.0
    for worker in ("a", "b", "c"):
        now = drive(model, fast, rng, 30, worker=worker, start=now)
    now = drive(model, slow, rng, 30, worker="d", start=now)
    assert model.speed("d").prefill_s > 2 * model.fleet().prefill_s
    for worker in ("a", "b", "c"):  # d sees nothing for a while
        now = drive(model, fast, rng, 60, worker=worker, start=now)
    assert close(model.speed("d").prefill_s, model.fleet().prefill_s, 0.1)


def test_a_wait_on_the_gateways_clock_is_read_on_the_engines() -> None:
    """A crowded gateway sees TTFTs ten times the engine's own: its waits say that much
    less of the engine's speed, and a wait that long is no sign of a slower worker."""
    model = FleetSpeed(PRIOR)
    for i in range(8):
        model.sent(f"r{i}", "w", i * 10.0, 1_000, streamed=True)
        model.first_token(f"r{i}", i * 10.0 + 1.0)
        model.ended(f"r{i}", 1_000, 0)
        model.observed(f"r{i}", 0.1, seen=1.0)
    before = model.speed("w")
    model.sent("late", "w", 100.0, 1_000, streamed=True)
    model.late(100.9)  # nine times the engine's TTFT on the gateway's clock: not late there
    assert model.speed("w") == before


def test_a_short_prompt_beside_others_cold_ones_waits_for_all_of_them() -> None:
    """llama.cpp prefills its slots in one batch a step: a short uncached turn (a restored
    session's new message) sent beside three cold prompts gets its first token with theirs,
    at the end of the step holding their whole prefill, not after as many of their tokens
    as its own. Booked that way, its wave was fit as an engine far slower than it is, with
    the gap in a large overhead: predictions 3x long."""
    per_token = 0.03
    model = FleetSpeed(Speed(overhead_s=0.0, prefill_s=per_token, decode_s=0.0))
    model.engine("w", 4, per_token)
    sizes = {"a": 1000, "b": 1000, "c": 1000, "s": 80}
    now, misses = 0.0, []
    for wave in range(12):
        sent = []
        for i, (name, size) in enumerate(sizes.items()):
            at = now + 0.1 * i
            sent.append((f"{wave}{name}", size, at, model.sent(f"{wave}{name}", "w", at, size)))
        first = now + 0.3 + per_token * sum(sizes.values())  # one step holds them all
        for rid, *_ in sent:
            model.first_token(rid, first)
        for rid, size, at, predicted in sent:
            model.ended(rid, size, 0)
            model.held(rid, 5.0)
            model.observed(rid, first - at)
            misses.append(abs(predicted - (first - at)) / (first - at))
        now = first + 6.0
    speed = model.speed("w")
    assert statistics.median(misses[-16:]) < 0.15  # was 2.4
    assert speed.overhead_s < 1.0  # was 72 s
    assert close(speed.prefill_s, per_token, 0.2)  # was 2.5x


def test_a_request_waiting_for_the_slot_computing_its_prefix_waits_for_that_request() -> None:
    """llama.cpp's slot plane holds a new session back for the busy slot computing its
    prefix (``after``): it waits for that request's end (its first token, as predicted
    until seen, and the mean decoding there), then prefills its own part."""
    model = FleetSpeed(Speed(overhead_s=0.0, prefill_s=0.01, decode_s=0.0))
    model.engine("w", 4, None)
    model.sent("r0", "w", -9990.0, 100)  # long ago: few requests a second (later sharers)
    model.first_token("r0", -989.0)
    model.ended("r0", 100, 0)
    model.held("r0", 2.0)  # a request decodes 2 s there
    assert model.sent("r1", "w", 10.0, 1000) == pytest.approx(10.0)
    # r1's first token 10 s on, its end 2 s later: 12 s of wait, then 0.5 s its own.
    assert model.predict("w", 50, 10.0, after="r1") == pytest.approx(12.0 + 0.5, abs=0.01)
    assert model.predict("w", 50, 10.0) == pytest.approx(10.5, abs=0.01)  # beside r1 instead
    model.first_token("r1", 25.0)  # later than predicted: seen
    assert model.predict("w", 50, 26.0, after="r1") == pytest.approx(1.0 + 0.5, abs=0.01)
    assert model.predict("w", 50, 26.0, after="gone") == pytest.approx(0.5, abs=0.01)


def test_a_parameter_held_at_its_bound_takes_back_what_it_lent_the_others() -> None:
    # The overhead and the decode move against each other (requests running in a near
    # constant count): a step that takes decode below nought raised the overhead by its
    # share; held at nought, the overhead gives that share back (``speed_fit._bound``).
    theta = [0.5, 1.0, -0.2, 0.0]
    p = [[1.0, 0.0, -0.8, 0.0], [0.0, 1.0, 0.0, 0.0], [-0.8, 0.0, 1.0, 0.0], [0.0] * 4]
    _bound(theta, p, [0.0] * 4, [math.inf] * 4)
    assert theta == pytest.approx([0.34, 1.0, 0.0, 0.0])
    theta = [0.5, 1.0, 0.1, 0.0]  # the overhead past its cap: the decode takes up its share
    _bound(theta, p, [0.0] * 4, [0.4, math.inf, math.inf, math.inf])
    assert theta == pytest.approx([0.4, 1.0, 0.1 + 0.8 * 0.1, 0.0])


def test_an_engine_of_slots_reporting_its_rate_is_not_rescaled_by_its_first_ttfts() -> None:
    """llama.cpp reports its own prefill rate (``engine``): the fit starts from it, no
    prior far off to rescale, and one early TTFT far off (a slot wait, a batch beside
    others' cold prompts) does not multiply the estimate (a fit once went to 508 tokens/s
    where /metrics said 43); an engine that reports nothing is still rescaled."""
    for slots, rate, bounded in ((4, 0.01, True), (None, None, False)):
        model = FleetSpeed(Speed(overhead_s=0.0, prefill_s=0.01, decode_s=0.0))
        model.engine("w", slots, rate)
        model.sent("r", "w", 0.0, 100)  # predicted 1 s
        model.first_token("r", 10.0)
        model.ended("r", 100, 0)
        model.observed("r", 10.0)  # 10x
        prefill_s = model.speed("w").prefill_s
        assert (prefill_s < 0.03) is bounded, prefill_s


def test_quiet_short_turns_over_a_long_cached_context_on_llama_cpp() -> None:
    """llama.cpp: each new token attends over the whole cached context, so a 50-token turn
    over 1,000 restored costs about twice its tokens (``speed_book.context``); and two
    sends a few ms apart are no rate of joiners for every quiet turn after (the mean gap,
    not the mean of 1 / gap, ``Book.sent_slot``). Real runs (/work/coord/re4x, replayed by
    benchmarks/speed_replay.py): median error 36/37/33% -> 23/34/26%. Before, each quiet
    turn was predicted beside a burst's worth of cold-sized joiners that never came, the
    fit pushed fast by those, and the turns over their context under-predicted."""
    per_token = 0.004
    model = FleetSpeed(Speed(overhead_s=0.0, prefill_s=per_token, decode_s=0.0))
    model.engine("w", 4, per_token)
    now, misses, n = 0.0, [], 0
    for turn in range(40):
        # A cold first wave (two sent 5 ms apart), then single turns over their context.
        burst = [(1000, 0), (1000, 0)] if turn == 0 else [(50, 1000)]
        for i, (uncached, cached) in enumerate(burst):
            rid, at = f"r{n}", now + 0.005 * i
            n += 1
            predicted = model.sent(rid, "w", at, uncached, streamed=True)
            ttft = 0.05 + per_token * uncached * (1.0 + 1e-3 * cached) * (i + 1)
            model.first_token(rid, at + ttft)
            model.ended(rid, uncached + cached, cached)
            model.observed(rid, ttft)
            model.held(rid, 1.0)
            misses.append(abs(predicted - ttft) / ttft)
        now += 3.0
    assert statistics.median(misses[-20:]) < 0.15


def test_the_log_keeps_the_tokens_a_request_was_booked_at_beside_usages_truth() -> None:
    """What the gateway guessed uncached at the send is kept beside its prediction: the
    guess's share of the error is told from the model's (``real_engine.py``)."""
    model = FleetSpeed(PRIOR)
    predicted = model.sent("r", "w", 0.0, 300.0)
    model.first_token("r", 0.2)
    model.ended("r", 1_000, 950)  # usage: 50 uncached, not 300
    model.observed("r", 0.2)
    assert list(model.log) == [("r", "w", predicted, 0.2, 300.0)]


def test_the_drivers_time_before_the_engine_has_a_request_is_predicted_not_fitted() -> None:
    """A slot restored before the request is sent (``setup``) is part of its TTFT as the
    gateway sees it, not of the engine's speed: predicted, and taken out of what is fitted."""
    model, bare = FleetSpeed(PRIOR), FleetSpeed(PRIOR)
    assert model.sent("r", "w", 0.0, 300.0, setup=0.4) == pytest.approx(
        bare.sent("r", "w", 0.0, 300.0) + 0.4
    )
    for m, setup in ((model, 0.4), (bare, 0.0)):
        m.first_token("r", 0.5 + setup)
        m.ended("r", 300, 0)
        m.observed("r", 0.5 + setup)
    assert model.speed("w") == bare.speed("w")  # the same engine, whatever the restore took
