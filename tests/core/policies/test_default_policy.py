"""Table tests of the default policy: stickiness, expected-TTFT placement, herding, replicas.

With the defaults (12,000 prefill tokens/s, 4 characters a token) one 256-character
block costs 64 tokens = 5.33 ms of prefill; ``queue(policy, worker, seconds)``
gives a worker that much queued prefill at time 0.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvgate.core.fleet import Health, Pressure
from kvgate.core.policies.default import DefaultConfig, DefaultPolicy

from .tables import CHARS_PER_S, THREE, chain, ctx, fleet, queue, request, with_loads, worker


@pytest.mark.parametrize(
    ("workers", "bound_to", "chosen", "reason"),
    [
        (with_loads(a=2, b=0, c=0), "a", "a", "affinity_hit"),
        # Soft pressure keeps an affine session.
        ((replace(THREE[0], pressure=Pressure.SOFT), *THREE[1:]), "a", "a", "affinity_hit"),
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
    decision = DefaultPolicy().pick(
        request(session="s", hashes=chain(1, 4)), ctx(fleet(*workers), bound_to)
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


def open_sessions(policy: DefaultPolicy, sessions: int, turns: int, blocks: int) -> None:
    """Sessions of ``turns`` turns, each adding ``blocks`` new blocks, long done by time 0."""
    elsewhere = fleet(worker("d"), now=-50.0)
    for n in range(sessions):
        key = f"old{n}"
        history: tuple[int, ...] = ()
        for turn in range(turns):
            history = (*history, *chain(500 + 10 * n + turn, blocks))
            turn_request = request(f"{key}-{turn}", session=key, hashes=history)
            if turn == 0:
                policy.pick(turn_request, ctx(elsewhere, key=key))
            policy.on_routed(turn_request, "d", -50.0)


def test_session_life_is_what_an_explicit_session_routes_over_its_turns() -> None:
    policy = DefaultPolicy()
    assert policy.session_life_s() == 0.0
    open_sessions(policy, sessions=3, turns=4, blocks=2)
    # Each turn recomputes only its 2 new blocks (5.33 ms each): 4 turns x 10.7 ms.
    assert policy.session_life_s() == pytest.approx(4 * 2 * 256 / CHARS_PER_S)


def test_a_new_session_is_placed_for_its_life_not_its_first_turn() -> None:
    """a holds the shared system prompt and a full cache; b is cold and idle.

    A headerless request behind the prompt takes a (2 new blocks there, the prompt's
    pull). A new session's first turn is the same request, but sessions here route
    40 blocks over their lives, and all of it would evict a's other conversations:
    it goes to b and computes the prompt there once.
    """
    capacity = 16 * 64  # 16 index blocks of KV
    workers = tuple(worker(w, kv_capacity_tokens=capacity) for w in ("a", "b"))
    policy = DefaultPolicy()
    policy.pick(request("probe", hashes=chain(9, 1)), ctx(fleet(*workers)))  # learns capacity
    policy.on_routed(request("others", hashes=chain(2, 24)), "a", -10.0)  # a's cache is full
    # ... and the prompt was sent since: still resident (``PrefixIndex.resident_depth``).
    policy.on_routed(request("prompt", hashes=chain(1, 8)), "a", -10.0)
    open_sessions(policy, sessions=2, turns=4, blocks=10)
    first_turn = (*chain(1, 8), *chain(3, 2))
    headerless = policy.pick(request("q", hashes=first_turn), ctx(fleet(*workers)))
    assert (headerless.worker, headerless.reason) == ("a", "prefix_match")
    opening = policy.pick(request("s1", session="new", hashes=first_turn), ctx(fleet(*workers)))
    assert (opening.worker, opening.reason) == ("b", "least_ttft")
    assert opening.affinity is not None and opening.affinity.worker == "b"


def test_headerless_requests_are_never_bound() -> None:
    policy = DefaultPolicy()
    policy.on_routed(request("w", hashes=chain(1, 8)), "c", 0.0)
    decision = policy.pick(request(hashes=chain(1, 8)), ctx(fleet(*THREE)))
    assert (decision.worker, decision.affinity) == ("c", None)


# c holds ``cached`` blocks of the prompt (plus one new block) and has ``queued``
# seconds of prefill ahead; a and b are idle and cold. c keeps the request while
# its expected TTFT minus the pull of its cache (half the seconds the cache saves,
# halved again at three queued seconds) is below recomputing on a cold worker.
@pytest.mark.parametrize(
    ("cached", "queued", "chosen", "reason"),
    [
        (8, 0.0, "c", "prefix_match"),
        # 7 ms slower than recomputing 8 blocks (43 ms) cold, but its cache pulls.
        (8, 0.05, "c", "prefix_match"),
        (8, 0.1, "a", "least_ttft"),  # a short prefix is cheap to recompute
        (60, 0.3, "c", "prefix_match"),  # a long one (15 KiB, 320 ms) is worth the wait
        (60, 0.8, "a", "least_ttft"),  # but not any wait: the busy worker's pull fades
    ],
)
def test_a_warm_worker_is_left_only_when_its_expected_ttft_is_clearly_worse(
    cached: int, queued: float, chosen: str, reason: str
) -> None:
    policy = DefaultPolicy()
    policy.on_routed(request("w", hashes=chain(1, cached)), "c", -10.0)  # done by now
    if queued:
        queue(policy, "c", queued)
    prompt = (*chain(1, cached), 99)
    decision = policy.pick(request("q", hashes=prompt), ctx(fleet(*THREE)))
    assert (decision.worker, decision.reason) == (chosen, reason)


def test_a_decision_says_how_much_of_its_prompt_requests_in_flight_there_hold() -> None:
    """What the KV gate counts as new KV on the chosen worker (``Decision.shared_chars``).

    Blocks in use by a request in flight are shared; blocks only cached (their
    request ended) take KV again, so they are not subtracted.
    """
    policy = DefaultPolicy()
    running = request("w", hashes=chain(1, 8))
    policy.on_routed(running, "b", -10.0)  # in flight: never reported back
    warm = policy.pick(request("q", hashes=(*chain(1, 8), 7)), ctx(fleet(*THREE)))
    assert (warm.worker, warm.reason, warm.shared_chars) == ("b", "prefix_match", 8 * 256)
    policy.on_usage(running, "b", 512, 0, -5.0)  # it ended: its blocks are only cached
    again = policy.pick(request("q2", hashes=(*chain(1, 8), 7)), ctx(fleet(*THREE)))
    assert (again.worker, again.reason, again.shared_chars) == ("b", "prefix_match", 0)
    cold = policy.pick(request("n", hashes=chain(2, 8)), ctx(fleet(*THREE)))
    assert (cold.reason, cold.shared_chars) == ("least_loaded", 0)
    policy.on_routed(request("t1", session="s", hashes=chain(3, 4)), "c", -10.0)
    turn = request("t2", session="s", hashes=(*chain(3, 4), 9))
    sticky = policy.pick(turn, ctx(fleet(*THREE), bound_to="c"))
    assert (sticky.worker, sticky.reason, sticky.shared_chars) == ("c", "affinity_hit", 4 * 256)


@pytest.mark.parametrize(
    ("field", "values", "chosen"),
    [
        ("kv_usage", {"a": 0.8, "b": 0.2, "c": 0.5}, "b"),  # equal costs: least KV in use
        ("in_flight", {"a": 3, "b": 1, "c": 2}, "b"),  # decode steps of requests in flight
    ],
)
def test_load_is_what_it_costs_a_request(field: str, values: dict, chosen: str) -> None:
    workers = tuple(replace(w, **{field: values[w.id]}) for w in THREE)
    decision = DefaultPolicy().pick(request(hashes=chain(5, 8)), ctx(fleet(*workers)))
    assert (decision.worker, decision.reason) == (chosen, "least_loaded")


def test_queued_prefill_drains_at_the_rate_and_never_exceeds_what_is_in_flight() -> None:
    policy = DefaultPolicy()
    queue(policy, "c", 1.0)
    assert policy.queued_tokens("c", 0.0) == pytest.approx(12_000)
    assert policy.queued_tokens("c", 0.5) == pytest.approx(6_000)
    assert policy.queued_tokens("c", 2.0) == 0
    # Reported done: it leaves the bound at once, whatever the drain says.
    filler = request("filler", hashes=(hash("filler"),), prompt_chars=CHARS_PER_S)
    policy.on_usage(filler, "c", 12_000, 0, 0.1)
    assert policy.queued_tokens("c", 0.1) == 0


def test_a_request_that_ends_with_no_usage_leaves_the_queue_too() -> None:
    """Its attempt failed, or its client went first: no usage will come (``on_dropped``)."""
    policy = DefaultPolicy()
    queue(policy, "c", 1.0)
    filler = request("filler", hashes=(hash("filler"),), prompt_chars=CHARS_PER_S)
    policy.on_dropped(filler, "c", 0.1)
    assert policy.queued_tokens("c", 0.1) == 0


def test_migration_with_nowhere_under_threshold_refuses() -> None:
    config = DefaultConfig(threshold_kind="in_flight", threshold=3)
    workers = with_loads(a=3, b=3, c=5)
    decision = DefaultPolicy(config).pick(request(session="s"), ctx(fleet(*workers), "a"))
    assert (decision.shed, decision.reason) == (True, "capacity_full")


def test_time_scale_puts_the_models_rates_on_the_drivers_clock() -> None:
    """An emulated fleet at time scale 10 prefills 12,000 model tokens in 0.1 real s."""
    policy = DefaultPolicy(DefaultConfig(time_scale=10.0))
    queue(policy, "c", 1.0)  # one model second of prefill
    assert policy.queued_tokens("c", 0.0) == pytest.approx(12_000)
    assert policy.queued_tokens("c", 0.05) == pytest.approx(6_000)
    assert policy.queued_tokens("c", 0.1) == 0
