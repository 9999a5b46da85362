"""``default`` on headerless conversations: which requests open one, and what one brings.

A headerless request opens a conversation unless its chain runs through the end of
a chain routed earlier; an opening is charged, in the eviction
term, for the prefill seconds headerless conversations route over their lives
(``chain_life_s``), as a new explicit session is for ``session_life_s``.
"""

from __future__ import annotations

import random

import pytest

from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import Pressure
from kvgate.core.policies.default import DefaultConfig, DefaultPolicy
from kvgate.core.prefix import build_features

from .tables import chain, ctx, fleet, request, worker

BLOCK_S = 256 / (12_000 * 4)  # prefill seconds of one 256-character block


def routed(policy: DefaultPolicy, name: str, hashes: tuple[int, ...], where: str = "d") -> None:
    """Route a headerless request long before time 0 (done by now)."""
    policy.on_routed(request(name, hashes=hashes), where, -50.0)


PREAMBLE = chain(1, 8)
FIRST = (*PREAMBLE, *chain(2, 3))  # one conversation's first turn


@pytest.mark.parametrize(
    ("hashes", "prompt_chars", "opens"),
    [
        # The conversation's next turn carries its first turn's whole prompt.
        ((*FIRST, *chain(3, 2)), None, False),
        # The same turn, its last block partial (hashed as it is, so never matched).
        ((*FIRST, *chain(3, 2)), 13 * 256 - 100, False),
        # A stranger behind the same preamble runs through no earlier chain's end.
        ((*PREAMBLE, *chain(4, 3)), None, True),
        # Nor does a prompt that is a prefix of the first turn, the preamble alone.
        (PREAMBLE, None, True),
        # Nothing in common.
        (chain(5, 4), None, True),
    ],
)
def test_a_headerless_request_opens_a_conversation_unless_it_extends_a_chain(
    hashes: tuple[int, ...], prompt_chars: int | None, opens: bool
) -> None:
    policy = DefaultPolicy()
    routed(policy, "t1", FIRST)
    assert policy.opens(request("q", hashes=hashes, prompt_chars=prompt_chars)) is opens


def test_nothing_routed_yet_and_a_requests_own_earlier_routing_open() -> None:
    policy = DefaultPolicy()
    assert policy.opens(request("t1", hashes=FIRST))
    routed(policy, "t1", FIRST)
    # Routed again (a retry): its own end is not an earlier conversation's.
    assert policy.opens(request("t1", hashes=FIRST))


def test_an_end_inside_a_coarse_block_is_marked_by_the_text_past_it() -> None:
    """Agents behind a tool preamble exactly as long as the fine blocks (16 KiB).

    Each first turn (preamble + task) ends, in whole blocks of its chain, at the
    preamble's end: by the chain alone every new agent would be the last one's next
    turn. Once two agents have ended past it, the ends' marks (the hash of the text
    past that block, ``ChainEnds``) tell them apart, and an agent's next turn runs
    through its own however much it adds.
    """
    preamble = "".join(random.Random(1).choice("abcdefgh ") for _ in range(16_384))

    def features(name: str, prompt: str) -> RequestFeatures:
        body = {"model": "m", "prompt": prompt}
        return build_features(body, {}, request_id=name, endpoint="completions")

    first = preamble + "task one: " * 320
    a1 = features("a1", first)
    assert len(a1.prefix_hashes) == 65 and a1.prompt_pieces  # 64 fine blocks, one partial
    policy = DefaultPolicy()
    policy.on_routed(a1, "d", -50.0)
    policy.on_routed(features("b1", preamble + "task two: " * 320), "d", -50.0)
    assert policy.opens(features("c1", preamble + "task three: " * 270))
    assert not policy.opens(features("a2", first + "observation " * 150))
    assert not policy.opens(features("a3", first + "observation " * 3_000))  # 36 KiB more


@pytest.mark.parametrize(
    ("a_in_flight", "expected"),
    [
        (0, ("a", "prefix_match")),  # its own task cached on a: a holds the most
        # 8 ms of decode steps on a against the task's 64 ms of prefill (and 32 ms more
        # pull: half the prefill a's cache saves); by the blocks alone b would win.
        (4, ("a", "prefix_match")),
        (60, ("b", "least_ttft")),  # 120 ms of decode steps: recomputing it on b is quicker
    ],
)
def test_an_agents_next_turn_goes_where_its_end_is_though_the_blocks_cannot_tell(
    a_in_flight: int, expected: tuple[str, str]
) -> None:
    """Both workers hold the 16 KiB preamble, the chain's whole blocks; a also holds the
    first turn's 3,072-character task, inside the coarse block after them, which no
    whole block covers. The first turn's end (``ChainEnds.through``) says where it went
    and how far it reached there: 768 tokens, 64 ms of prefill, cached on a alone."""
    preamble = "".join(random.Random(1).choice("abcdefgh ") for _ in range(16_384))

    def features(name: str, prompt: str) -> RequestFeatures:
        body = {"model": "m", "prompt": prompt}
        return build_features(body, {}, request_id=name, endpoint="completions")

    first = preamble + "task one: " * 320
    policy = DefaultPolicy()
    policy.on_routed(features("a1", first), "a", -50.0)
    policy.on_routed(features("b1", preamble + "task two: " * 320), "b", -50.0)
    later = features("a2", first + "observation " * 60)
    assert policy.index.match(later.prefix_hashes) == {"a": 64, "b": 64}
    workers = (worker("a", in_flight=a_in_flight), worker("b"))
    decision = policy.pick(later, ctx(fleet(*workers)))
    assert (decision.worker, decision.reason) == expected


NEXT = (*FIRST, *chain(3, 2))  # the conversation's next turn: its home b holds its context
STRANGER = (*PREAMBLE, *chain(4, 3))  # behind the same preamble: a new conversation
FAR_STRANGER = (*PREAMBLE, *chain(4, 9))  # the same, the preamble less than half of it


@pytest.mark.parametrize(
    ("pressure", "kv_usage", "hashes", "expected"),
    [
        (Pressure.SOFT, None, NEXT, "b"),
        # A new conversation behind the preamble b holds: soft pressure turns away
        # new sessions only, so the cost weighs b's cache against idle a, which would
        # copy the preamble (8 of 11 blocks, or of 17: less than half of it).
        (Pressure.SOFT, None, STRANGER, "b"),
        (Pressure.SOFT, None, FAR_STRANGER, "b"),
        # Under hard pressure too: headerless work is weighed by its cost, and the KV
        # gate (``core.route``) holds it at the gateway until its KV fits on b.
        (Pressure.HARD, 0.97, NEXT, "b"),
        (Pressure.HARD, 0.97, STRANGER, "b"),
    ],
)
def test_a_pressured_worker_takes_headerless_work_by_its_cost(
    pressure: Pressure, kv_usage: float | None, hashes: tuple[int, ...], expected: str
) -> None:
    """b took the first turn and has since reached a pressure mark; a is idle and cold."""
    policy = DefaultPolicy()
    routed(policy, "t1", FIRST, where="b")
    workers = (worker("a"), worker("b", pressure=pressure, kv_usage=kv_usage))
    assert policy.pick(request("q", hashes=hashes), ctx(fleet(*workers))).worker == expected


def conversations(policy: DefaultPolicy, count: int, turns: int, blocks: int) -> None:
    """Headerless conversations of ``turns`` turns, each adding ``blocks`` new blocks, on d."""
    for n in range(count):
        history: tuple[int, ...] = ()
        for turn in range(turns):
            history = (*history, *chain(500 + 10 * n + turn, blocks))
            routed(policy, f"c{n}-{turn}", history)


def test_chain_life_is_what_a_headerless_conversation_routes_over_its_turns() -> None:
    """Conversations of 4 turns a second apart, each turn recomputing its 2 new blocks.

    A turn unanswered for 4 mean gaps is final: by the last conversation's last turn,
    12 turns were continued and 3 final (the last one's not yet), 1 + 12 / (3 + 1)
    turns of 2 blocks; once that one is final too, 1 + 12 / 5."""
    policy = DefaultPolicy(DefaultConfig(recent_half_life_s=1e9))
    assert policy.chain_life_s() == 0.0
    for n in range(4):
        history: tuple[int, ...] = ()
        for turn in range(4):
            history = (*history, *chain(500 + 10 * n + turn, 2))
            policy.on_routed(request(f"c{n}-{turn}", hashes=history), "d", 10.0 * n + turn)
    assert policy.chain_life_s() == pytest.approx((1 + 12 / 4) * 2 * BLOCK_S)
    policy.on_routed(request("later", hashes=chain(900, 2)), "d", 100.0)  # opens, 2 blocks
    assert policy.chain_life_s() == pytest.approx((1 + 12 / 5) * 2 * BLOCK_S)
    assert policy.session_life_s() == 0.0  # explicit sessions are counted apart


def test_one_shot_traffic_learns_a_life_of_its_own_prefill() -> None:
    """Every request stands alone (shared-prefix groups): the life is one request's."""
    policy = DefaultPolicy()
    for n in range(12):
        routed(policy, f"q{n}", (*chain(1 + n % 3, 8), *chain(100 + n, 2)))
    # The first of each group computes its 8-block prompt too; the rest 2 blocks each.
    assert policy.chain_life_s() == pytest.approx((3 * 10 + 9 * 2) * BLOCK_S / 12)


def fleet_behind_a_preamble(turns: int) -> tuple[DefaultPolicy, tuple]:
    """a holds the shared preamble and a full cache; b is cold and idle.

    Besides two strangers behind the preamble on a, headerless traffic on d taught
    the policy its conversations' life: ``turns`` turns of 10 new blocks each.
    """
    capacity = 16 * 64  # 16 index blocks of KV
    workers = tuple(worker(w, kv_capacity_tokens=capacity) for w in ("a", "b"))
    policy = DefaultPolicy()
    policy.pick(request("probe", hashes=chain(9, 1)), ctx(fleet(*workers)))  # learns capacity
    routed(policy, "x", (*PREAMBLE, *chain(2, 12)), "a")
    routed(policy, "y", (*PREAMBLE, *chain(4, 12)), "a")  # a's cache is full
    if turns == 1:
        for n in range(20):
            routed(policy, f"one{n}", chain(600 + n, 2))
    else:
        conversations(policy, count=2, turns=turns, blocks=10)
    return policy, workers


def test_a_headerless_opening_is_placed_for_the_conversations_life() -> None:
    """Conversations here route 40 blocks over their lives: one more would evict a's
    other conversations, so a new one behind the preamble goes to cold b (10 blocks
    to compute now, against 2 on a), and its next turn follows its chain there."""
    policy, workers = fleet_behind_a_preamble(turns=4)
    first = (*PREAMBLE, *chain(3, 2))
    opening = policy.pick(request("q1", hashes=first), ctx(fleet(*workers)))
    assert (opening.worker, opening.reason, opening.affinity) == ("b", "least_ttft", None)
    routed(policy, "q1", first, "b")
    second = policy.pick(request("q2", hashes=(*first, *chain(5, 2))), ctx(fleet(*workers)))
    assert (second.worker, second.reason) == ("b", "prefix_match")


def test_one_shot_traffic_still_joins_the_warm_preamble() -> None:
    """Where requests stand alone, an opening brings only itself: it stays with the cache."""
    policy, workers = fleet_behind_a_preamble(turns=1)
    opening = policy.pick(request("q1", hashes=(*PREAMBLE, *chain(3, 2))), ctx(fleet(*workers)))
    assert (opening.worker, opening.reason) == ("a", "prefix_match")


def test_a_full_caches_pull_fades_so_a_new_conversation_pays_for_a_cold_preamble() -> None:
    """The pull stands for later requests this cache will serve; a full cache keeps them
    only by evicting others, so the pull fades with the cache's fill.

    In prefill seconds of one block: an opening of 8 preamble + 2 own blocks costs
    10 on cold b. On a, where the preamble is cached, it costs its 2 own blocks plus
    the conversations' life (9 here) times a's fill, minus the pull (0.5 x 8 blocks)
    times what is left of a's room: full, 11 (b wins); with room, less than 10.
    """
    capacity = 16 * 64  # 16 index blocks of KV
    workers = tuple(worker(w, kv_capacity_tokens=capacity) for w in ("a", "b"))
    for full in (True, False):
        policy = DefaultPolicy()
        policy.pick(request("probe", hashes=chain(9, 1)), ctx(fleet(*workers)))
        routed(policy, "x", (*PREAMBLE, *chain(2, 4)), "a")
        routed(
            policy, "y", (*PREAMBLE, *chain(4, 4)) if full else chain(4, 4), "a" if full else "d"
        )
        conversations(policy, count=2, turns=1, blocks=10)
        decision = policy.pick(request("q", hashes=(*PREAMBLE, *chain(3, 2))), ctx(fleet(*workers)))
        assert decision.worker == ("b" if full else "a"), full


@pytest.mark.parametrize(("reply_tokens", "expected"), [(0, "b"), (400, "a")])
def test_a_later_turn_weighs_the_reply_its_home_holds(reply_tokens: int, expected: str) -> None:
    """Both workers hold a 5,888-character system prompt; a also holds a conversation's
    first turn past it (300 characters) and, the worker said (``completion_tokens``), a
    400-token reply, which the next turn re-sends. a's cache is fuller (another
    conversation went there), so by its whole blocks alone, one block more than b's, the
    next turn would go to emptier b and recompute the reply there (the turns headerless
    chat moved in the simulator); with the reply counted it stays home."""
    rng = random.Random(7)
    system = "".join(rng.choice("abcdefgh ") for _ in range(5_888))

    def features(name: str, *parts: str) -> RequestFeatures:
        body = {"model": "m", "prompt": "".join(parts)}
        return build_features(body, {}, request_id=name, endpoint="completions")

    first = (system, "user: " * 50)
    reply = "".join(rng.choice("ijklmnop ") for _ in range(1_600))
    capacity = {"kv_capacity_tokens": 16_000}
    policy = DefaultPolicy()
    placed = policy.pick(features("t1", *first), ctx(fleet(worker("a", **capacity))))
    assert placed.worker == "a"
    policy.on_routed(features("t1", *first), "a", -50.0)
    policy.on_usage(features("t1", *first), "a", 1_550, 0, -49.0, completion_tokens=reply_tokens)
    filler = features("f1", "".join(rng.choice("qrstuvw ") for _ in range(24_000)))
    policy.pick(filler, ctx(fleet(worker("a", **capacity))))
    policy.on_routed(filler, "a", -40.0)
    stranger = features("s1", system, "other: " * 40)
    policy.pick(stranger, ctx(fleet(worker("b", **capacity))))
    policy.on_routed(stranger, "b", -30.0)
    later = features("t2", *first, reply, "user: next " * 30)
    assert not policy.opens(later)
    assert policy.index.match(later.prefix_hashes) == {"a": 24, "b": 23}
    workers = (worker("a", **capacity), worker("b", **capacity))
    assert policy.pick(later, ctx(fleet(*workers))).worker == expected
