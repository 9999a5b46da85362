"""``default`` on engines that report themselves (llama.cpp: ``/slots``, ``/metrics``).

Such an engine keeps KV per slot: a request that finds a free slot which has served
nothing recomputes a prefix the worker's other slots hold. And it prefills at its own
rate (~150 tokens/s on one CPU thread, not the configured 12,000): its queue drains at
that rate, so work sent there a second ago still stands in the way of the next request.
Workers that report neither are placed exactly as before.
"""

from __future__ import annotations

import pytest

from kvgate.core.fleet import WorkerState
from kvgate.core.policies.default import DefaultPolicy

from .tables import chain, ctx, fleet, request, worker

CPU = 1.0 / 150.0  # a one-thread llama.cpp's prefill seconds a token


def slotted(worker_id: str, prefill_s: float | None = CPU) -> WorkerState:
    """A llama.cpp worker of 4 slots that prefills at ``prefill_s`` seconds a token."""
    return worker(worker_id, slots=4, engine_prefill_s=prefill_s)


def test_a_shared_prefix_is_not_cached_in_a_cold_free_slot() -> None:
    """The second opening behind one system prompt goes to the idle worker: the first
    one's worker would give it a cold slot, and the first one's prefill still queues
    there; it is booked uncached where it goes."""
    policy = DefaultPolicy()
    workers = (slotted("a"), slotted("b"))
    first = request("r1", session="s1", hashes=chain(1, 16, tail=1))
    assert policy.pick(first, ctx(fleet(*workers), key="s1")).worker == "a"
    policy.on_routed(first, "a", 0.0)
    second = request("r2", session="s2", hashes=chain(1, 16, tail=2))
    assert policy.pick(second, ctx(fleet(*workers, now=0.1), key="s2")).worker == "b"
    policy.on_routed(second, "b", 0.1)
    assert policy.queued_tokens("b", 0.1) == pytest.approx(1024.0)  # 16 blocks, all of it


@pytest.mark.parametrize(("prefill_s", "queued"), [(None, 1024.0), (CPU, 2 * 1024.0 - 15.0)])
def test_a_request_sent_to_a_cold_slot_is_booked_uncached(
    prefill_s: float | None, queued: float
) -> None:
    """On ``a``'s second free slot nothing is cached, whatever the index holds there (the
    first's 1,024 tokens drained in 0.1 s at the configured rate, 15 of them at the
    engine's)."""
    policy = DefaultPolicy()
    workers = (slotted("a", prefill_s), slotted("b", prefill_s))
    first = request("r1", session="s1", hashes=chain(1, 16, tail=1))
    policy.pick(first, ctx(fleet(*workers), key="s1"))
    policy.on_routed(first, "a", 0.0)
    second = request("r2", session="s2", hashes=chain(1, 16, tail=2))
    policy.pick(second, ctx(fleet(*workers, now=0.1), key="s2"))
    policy.on_routed(second, "a", 0.1)
    assert policy.queued_tokens("a", 0.1) == pytest.approx(queued)


def test_a_free_slot_that_served_keeps_the_prefix() -> None:
    """Once a request there ended, its slot is free and warm: the prefix counts again."""
    policy = DefaultPolicy()
    workers = (slotted("a"), slotted("b"))
    first = request("r1", session="s1", hashes=chain(1, 16, tail=1))
    policy.pick(first, ctx(fleet(*workers), key="s1"))
    policy.on_routed(first, "a", 0.0)
    policy.on_first_token(first, "a", 30.0)
    policy.on_usage(first, "a", 1024, 0, 31.0, completion_tokens=32)
    second = request("r2", session="s2", hashes=chain(1, 16, tail=2))
    decision = policy.pick(second, ctx(fleet(*workers, now=60.0), key="s2"))
    assert (decision.worker, decision.reason) == ("a", "prefix_match")


def test_the_queue_drains_at_the_engines_own_rate() -> None:
    """Unlearned, the queue drains at the engine's reported rate, not the configured one."""
    policy = DefaultPolicy()
    workers = (slotted("a"), slotted("b"))
    big = request("big", hashes=(7,), prompt_chars=4 * 1500)  # 1,500 tokens
    policy.pick(big, ctx(fleet(*workers)))
    policy.on_routed(big, "a", 0.0)
    # 1 s later, 150 of its 1,500 tokens are done at 150 tokens/s (all, at 12,000).
    assert policy.queued_tokens("a", 1.0) == pytest.approx(1350.0)
    plain = DefaultPolicy()
    plain.on_routed(big, "a", 0.0)
    assert plain.queued_tokens("a", 1.0) == 0.0


def test_workers_that_report_nothing_are_placed_as_before() -> None:
    """Without slots or a reported rate the prefix held on ``a`` keeps the second there."""
    policy = DefaultPolicy()
    first = request("r1", session="s1", hashes=chain(1, 16, tail=1))
    policy.on_routed(first, "a", 0.0)
    second = request("r2", session="s2", hashes=chain(1, 16, tail=2))
    plain = (worker("a"), worker("b"))
    assert policy.pick(second, ctx(fleet(*plain, now=0.1), key="s2")).worker == "a"


def test_past_the_slots_a_request_waits_for_one_to_free() -> None:
    """Four requests hold ``a``'s four slots and none has its first token 30 s on: the next
    waits for one of them there (``core.batch``), though at the engine's rate the queue
    estimate has drained, and ``b``'s free slot, cold, is sooner."""
    policy = DefaultPolicy()
    workers = (slotted("a"), slotted("b"))
    for i in range(4):
        held = request(f"r{i}", session=f"s{i}", hashes=chain(1, 16, tail=i))
        policy.pick(held, ctx(fleet(*workers), key=f"s{i}"))
        policy.on_routed(held, "a", 0.0)
    busy = (worker("a", slots=4, engine_prefill_s=CPU, in_flight=4),)
    assert policy.queued_tokens("a", 30.0) == 0.0
    nxt = request("r9", session="s9", hashes=chain(1, 16, tail=9))
    decision = policy.pick(nxt, ctx(fleet(*busy, workers[1], now=30.0), key="s9"))
    assert decision.worker == "b"


def test_what_the_slot_plane_finds_for_a_new_session_is_booked_cached() -> None:
    """llama.cpp's slot plane gives a new session the slot computing (or holding, or saved
    with) its shared prefix (``slot_shares``): booked with those blocks cached, and after
    the request computing them (it waits for its slot), not as a cold slot's whole prompt."""
    from dataclasses import replace

    policy = DefaultPolicy()
    workers = (slotted("a"), slotted("b"))
    first = request("r1", session="s1", hashes=chain(1, 16, tail=1))
    policy.pick(first, ctx(fleet(*workers), key="s1"))
    policy.on_routed(first, "a", 0.0)
    second = replace(
        request("r2", session="s2", hashes=chain(1, 16, tail=2)), slot_shares=(("a", 15, "r1"),)
    )
    policy.pick(second, ctx(fleet(*workers, now=0.1), key="s2"))
    policy.on_routed(second, "a", 0.1)
    booked = policy.speed.books["a"].sent["r2"]
    assert booked.uncached == pytest.approx(64.0)  # the last block's 256 characters
    # r1's prefill less the 0.1 s it has had (and 0 s decoding).
    assert booked.wait == pytest.approx(1024 * CPU - 0.1)


def test_what_the_slot_plane_counts_in_the_engines_tokens_is_booked_as_it_says() -> None:
    """Where the slot plane tells what a worker computes of a prompt (``slot_uncached``, from
    its session's last turn's usage), that is booked there, not the index's and the last
    reply's guess in characters (a later turn over ~1,100 cached tokens was booked at 0-40
    tokens that computed 40-270); elsewhere the policy's own guess stands."""
    from dataclasses import replace

    policy = DefaultPolicy()
    workers = (slotted("a"), slotted("b"))
    turn = replace(
        request("r1", session="s1", hashes=chain(1, 16, tail=1)), slot_uncached=(("a", 69, 0.0),)
    )
    policy.pick(turn, ctx(fleet(*workers), key="s1"))
    policy.on_routed(turn, "a", 0.0)
    assert policy.speed.books["a"].sent["r1"].uncached == pytest.approx(69.0)
    other = replace(request("r2", session="s2", hashes=chain(1, 16, tail=2)), slot_uncached=())
    policy.on_routed(other, "b", 0.0)
    assert policy.speed.books["b"].sent["r2"].uncached == pytest.approx(1024.0)  # its own guess


def test_an_engine_of_slots_takes_no_more_than_one_request_past_the_least_loaded() -> None:
    """On a busy CPU a llama.cpp worker's TTFTs grow with its requests in flight faster than
    the fit follows: placed by the model alone, 5 openings of 5 went to one worker (TTFT
    p50 10 s, round robin's 1.5 s). Its warm prefix keeps a new session only while it has
    at most one request more than the least loaded."""
    policy = DefaultPolicy()
    first = request("r1", session="s1", hashes=chain(1, 16, tail=1))
    policy.pick(first, ctx(fleet(slotted("a"), slotted("b")), key="s1"))
    policy.on_routed(first, "a", 0.0)
    policy.on_usage(first, "a", 1_024, 0, 5.0)  # a's slot holds the shared prefix
    nxt = request("r2", session="s2", hashes=chain(1, 16, tail=2))

    def placed(in_flight: int) -> str:
        a = worker("a", slots=4, engine_prefill_s=CPU, in_flight=in_flight)
        return policy.pick(nxt, ctx(fleet(a, slotted("b"), now=30.0), key="s2")).worker

    assert placed(1) == "a"  # one more than b: the warm prefix wins
    assert placed(2) == "b"
