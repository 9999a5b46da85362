"""``Lives`` on real prompts: a later turn runs through the earlier turn's end.

Past the fine blocks (16 KiB) a chain's blocks are 4 KiB coarse, so where in one a
prompt ends is marked by the hash of its text past its last whole block. A later
turn carries the earlier turn's prompt, so it runs through that end however much
it adds; a stranger behind the same preamble does not.
"""

from __future__ import annotations

import random
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.core.chain import chain_chars
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.lives import Lives
from kvgate.core.prefix import FeatureConfig, build_features
from kvgate.types import WorkerId

CFG = FeatureConfig()
FINE_END = CFG.block_chars * CFG.max_blocks  # 16 KiB
DEPTH = partial(
    chain_chars, width=CFG.block_chars, fine_blocks=CFG.max_blocks, coarse_factor=CFG.coarse_factor
)


def text(seed: int, size: int, alphabet: str = "abcdefghij klmnopqrstuvwxyz.") -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(size))


def features(name: str, *parts: str) -> RequestFeatures:
    """A headerless completions request whose prompt is ``parts`` joined."""
    body = {"model": "m", "prompt": "".join(parts)}
    return build_features(body, {}, request_id=name, endpoint="completions")


def ends(*routed: RequestFeatures, capacity: int = 1_000) -> Lives:
    found = Lives(DEPTH, capacity)
    for one in routed:
        found.note(one, WorkerId(f"w-{one.request_id}"))
    return found


CONVERSATION = text(1, 160_000)
PREAMBLE = text(2, FINE_END)


@settings(max_examples=60, deadline=None)
@given(first=st.integers(CFG.block_chars, 100_000), added=st.integers(0, 60_000))
def test_a_later_turn_runs_through_where_the_earlier_turn_ended(first: int, added: int) -> None:
    """Whatever block either turn ends in, and however much the later one adds.

    A stranger ended past the same last whole block, so the block is no lone end:
    only the earlier turn's exact mark can tell the later turn is its next one.
    """
    earlier = features("t1", CONVERSATION[:first])
    n = len(earlier.prefix_hashes)
    full = n if DEPTH(n) <= first else n - 1  # the earlier turn's whole blocks
    whole = DEPTH(full)
    stranger = features("u1", CONVERSATION[:whole], text(70, DEPTH(full + 1) - whole - 1))
    assert stranger.prefix_hashes[:full] == earlier.prefix_hashes[:full]
    later = features("t2", CONVERSATION[: first + added])
    assert not ends(earlier, stranger).opens(later)
    # Where it went, and its end to within a fine block: the later turn's cache there.
    end = ends(earlier, stranger).through(later)
    assert end is not None and end[1] == full and whole <= end[2] <= first
    assert first - end[2] < CFG.block_chars
    # Within the fine blocks B is the mark: the stranger's end, there, is the same.
    assert end[0::3] == ("w-t1", "t1") or (end[2] == whole and end[0::3] == ("w-u1", "u1"))


def test_strangers_behind_a_preamble_as_long_as_the_fine_blocks_open() -> None:
    """The shape where the chain alone reads every new agent as the last one's next turn:
    each first turn ends, in whole blocks of its chain, at the preamble's end. The
    first stranger reads as the one agent's next turn (a lone end); once two agents
    ended there, their marks tell every later one apart."""
    agents = [features(f"a{n}", PREAMBLE, text(10 + n, 3_200)) for n in range(4)]
    assert len(agents[0].prefix_hashes) == CFG.max_blocks + 1  # the task: one partial block
    preamble_chain = agents[0].prefix_hashes[:-1]
    assert all(one.prefix_hashes[: CFG.max_blocks] == preamble_chain for one in agents)
    opened = [ends(*agents[:n]).opens(agent) for n, agent in enumerate(agents)]
    assert opened == [True, False, True, True]
    # Each agent's own next turn, 20 KiB of observations later, extends it.
    seen = ends(*agents)
    for n in range(4):
        later = features(f"b{n}", PREAMBLE, text(10 + n, 3_200), text(20, 20_000))
        # Its own end and worker; the texts agree to the task's end, 3,200 characters
        # past the preamble (its mark covers 3,072, in fine blocks).
        assert seen.through(later) == (f"w-a{n}", CFG.max_blocks, FINE_END + 3_200, f"a{n}")


def test_a_mark_is_seeded_with_its_block() -> None:
    """The same task behind another preamble is no turn of this agent's: the mark of an
    end is its text's hash seeded with the block before it, not the text's alone."""
    other = text(3, FINE_END)
    task = text(11, 3_200)
    agents = (
        features("a", PREAMBLE, task),
        *(features(f"b{n}", other, text(12 + n, 3_200)) for n in range(2)),
    )
    assert ends(*agents).opens(features("c", other, task, text(20, 5_000)))


def test_a_retry_opens_and_a_lone_end_is_run_through_whatever_follows() -> None:
    first = features("t1", PREAMBLE, text(10, 3_200))
    seen = ends(first)
    assert seen.opens(first)  # its own end is not an earlier conversation's
    assert not seen.opens(features("t2", PREAMBLE, text(10, 3_000)))
    assert not seen.opens(features("t3", PREAMBLE, text(30, 5_000)))
    assert ends(first, features("u1", PREAMBLE, text(11, 3_200))).opens(
        features("t4", PREAMBLE, text(10, 3_000))
    )


def test_a_traces_next_turn_without_the_earlier_turns_partial_block_extends_it() -> None:
    """A replayed trace re-sends an earlier turn's whole blocks, not its partial last one:
    the later turn runs through the earlier's last whole block, not its exact end."""
    earlier = features("t1", CONVERSATION[:38_912], text(60, 1_500))
    later = features("t2", CONVERSATION[:60_000], text(61, 700))
    stranger = features("u1", CONVERSATION[:36_864], text(62, 3_000))
    assert not ends(earlier).opens(later)
    assert ends(earlier, stranger).opens(later)  # past a fork, only the exact end counts


def test_a_later_turn_reaches_the_earlier_prompts_end_and_its_reply() -> None:
    """The engine kept the earlier turn's prompt to its end and the reply it generated,
    which the later turn re-sends next: the end covers both once the reply is known, up
    to the later prompt's end. Within the fine blocks the mark is the last whole block."""
    first = 6_000  # 23 whole blocks and 112 characters
    earlier = features("t1", CONVERSATION[:first])
    seen = ends(earlier)
    later = features("t2", CONVERSATION[:9_000])
    assert seen.through(later) == ("w-t1", 23, first, "t1")  # its exact end
    seen.replied(earlier, 1_800)
    assert seen.through(later) == ("w-t1", 23, first + 1_800, "t1")
    short = features("t3", CONVERSATION[:7_000])  # a reply past its own end: to that end
    assert seen.through(short) == ("w-t1", 23, 7_000, "t1")
    seen.replied(features("gone", CONVERSATION[:first]), 500)  # never noted: no end to extend
    assert seen.through(later) == ("w-t1", 23, first + 1_800, "t1")


def test_a_chats_next_turn_reaches_through_the_assistants_reply() -> None:
    """The shape as the gateway sees it: chat messages, the next turn re-sending the
    conversation with the assistant's reply. Its text starts with the first turn's
    exact text, so the end covers that and, once its length is known, the reply."""
    system = {"role": "system", "content": "You answer questions about serving. " * 160}
    first = [system, {"role": "user", "content": "What is a KV cache? " * 5}]
    reply = "It keeps each token's keys and values. " * 18
    later = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "And?"}]
    t1 = build_features({"model": "m", "messages": first}, {}, request_id="t1")
    t2 = build_features({"model": "m", "messages": later}, {}, request_id="t2")
    seen = ends(t1)
    worker, blocks, reach, rid = seen.through(t2) or ("", 0, 0, "")
    assert (worker, rid, reach) == ("w-t1", "t1", t1.prompt_chars)
    assert blocks == t1.prompt_chars // CFG.block_chars  # its whole blocks
    seen.replied(t1, len(reply))
    assert seen.through(t2) == (worker, blocks, t1.prompt_chars + len(reply), rid)
    assert t1.prompt_chars + len(reply) < t2.prompt_chars


def test_a_later_turn_that_rewrote_the_earlier_partial_block_reaches_no_further() -> None:
    """A trace's next turn re-sends the earlier whole blocks but not its partial last one,
    nor its reply: where the texts part before the earlier exact end, the end covers the
    earlier turn's whole blocks alone, as its mark does."""
    earlier = features("t1", CONVERSATION[:6_000])
    seen = ends(earlier)
    seen.replied(earlier, 1_800)
    rewritten = features("t2", CONVERSATION[: 23 * CFG.block_chars], text(61, 3_000))
    assert seen.through(rewritten) == ("w-t1", 23, 23 * CFG.block_chars, "t1")
    # A prompt that ended on a block boundary agrees to its end wherever the next goes.
    exact = features("e1", CONVERSATION[: 23 * CFG.block_chars])
    boundary = ends(exact)
    boundary.replied(exact, 400)
    assert boundary.through(rewritten) == ("w-e1", 23, 23 * CFG.block_chars + 400, "e1")


def test_the_oldest_ends_are_forgotten_first() -> None:
    turns = [features(f"c{n}", text(30 + n, 30_000)) for n in range(3)]
    seen = ends(*turns, capacity=2)
    assert len(seen) == 2
    later = [features(f"d{n}", t.prompt_pieces[0], text(40, 9_000)) for n, t in enumerate(turns)]
    assert [seen.opens(one) for one in later] == [True, False, False]


def test_without_its_text_a_request_is_marked_at_its_last_whole_block() -> None:
    """``block_mode: tokens`` keeps no text: an end is the chain's last whole block."""
    config = FeatureConfig(block_mode="tokens", block_tokens=2)
    body = {"model": "m", "prompt": list(range(8))}
    first = build_features(body, {}, config, request_id="t1", endpoint="completions")
    assert first.prompt_pieces == ()
    seen = Lives(partial(chain_chars, width=2, fine_blocks=64, coarse_factor=16), 10)
    seen.note(first, WorkerId("a"))
    body["prompt"] = list(range(14))
    later = build_features(body, {}, config, request_id="t2", endpoint="completions")
    assert seen.through(later) == ("a", 4, 8, "t1")


def test_strangers_behind_a_shared_opening_run_through_none_of_their_ends() -> None:
    """Agents behind one preamble end in their own tasks, so a new agent behind the
    preamble runs through none of them."""
    agents = [features(f"a{n}", PREAMBLE, text(10 + n, 9_000)) for n in range(3)]
    seen = ends(*agents)
    assert seen.opens(features("a9", PREAMBLE, text(19, 9_000)))
    assert len(seen) == 3


def test_without_lone_ends_shared_marks_or_reach_only_a_single_requests_mark_counts() -> None:
    """``ttft``'s ``Lives``: a lone end is no end, nor is a mark noted twice (a retry, or
    strangers' identical prompts); one request's mark is, the shallowest first, covering
    its mark's characters (a fine block's multiple past ``B``), not its exact end."""
    first = features("t1", PREAMBLE, text(10, 3_200))
    seen = Lives(DEPTH, lone=False, shared=False, reach=False)
    seen.note(first, WorkerId("w-t1"))
    assert seen.opens(features("t2", PREAMBLE, text(30, 5_000)))  # past the lone end
    later = features("t3", PREAMBLE, text(10, 3_200), text(20, 20_000))
    mark = FINE_END + 3_200 // CFG.block_chars * CFG.block_chars
    assert seen.through(later) == ("w-t1", CFG.max_blocks, mark, "t1")
    seen.note(features("t4", PREAMBLE, text(10, 3_200), text(20, 8_000)), WorkerId("w-t4"))
    assert seen.through(later) == ("w-t1", CFG.max_blocks, mark, "t1")  # the shallowest
    seen.note(features("u1", PREAMBLE, text(10, 3_200)), WorkerId("w-u1"))  # the same end
    end = seen.through(later)
    assert end is not None and end[0::3] == ("w-t4", "t4")
