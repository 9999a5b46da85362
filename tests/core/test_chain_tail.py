"""The chain's tail: where in a coarse block a prompt ends (``core.chain.chain_tail_hashes``).

A later turn of a conversation carries the earlier turn's whole prompt; past the
fine blocks the chain alone cannot show that, since the earlier turn's last
(partial) coarse block is whole in the later one. The tail hashes the last coarse
blocks again in fine blocks, so the earlier turn's last fine block is among the
later turn's own.
"""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.core.chain import TAIL_SPAN, chain_tail_hashes, pieces_chain_hashes
from kvgate.core.prefix import FeatureConfig

CFG = FeatureConfig()
FINE_END = CFG.block_chars * CFG.max_blocks  # 16 KiB
COARSE = CFG.block_chars * CFG.coarse_factor  # 4 KiB


def text(seed: int, size: int, alphabet: str = "abcdefghij klmnopqrstuvwxyz.") -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(size))


def tail(*pieces: str) -> tuple[int, ...]:
    end = sum(map(len, pieces))
    chain = pieces_chain_hashes(
        pieces, CFG.block_chars, CFG.max_blocks, coarse_factor=CFG.coarse_factor
    )
    return chain_tail_hashes(
        pieces,
        chain,
        CFG.block_chars,
        CFG.max_blocks,
        coarse_factor=CFG.coarse_factor,
        end=end,
    )


CONVERSATION = text(1, 120_000)


@settings(max_examples=60, deadline=None)
@given(
    first=st.integers(FINE_END + CFG.block_chars, 100_000),
    added=st.integers(0, TAIL_SPAN * COARSE - COARSE),
)
def test_a_later_turn_runs_through_where_the_earlier_turn_ended(first: int, added: int) -> None:
    """Whatever coarse block either turn ends in, for turns that add up to a coarse block."""
    earlier = tail(CONVERSATION[:first])
    later = tail(CONVERSATION[: first + added])
    assert earlier
    assert earlier[-1] in later


def test_strangers_behind_a_preamble_as_long_as_the_fine_blocks_share_no_tail() -> None:
    """The shape where the chain alone reads every new agent as the last one's next turn."""
    preamble = text(2, FINE_END)
    agents = [tail(preamble, text(10 + n, 3_200)) for n in range(4)]
    for n, one in enumerate(agents):
        for other in agents[n + 1 :]:
            assert not set(one) & set(other)
    # The chain itself agrees on every whole block: the preamble's 64.
    first, second = (
        pieces_chain_hashes(
            (preamble, text(10 + n, 3_200)),
            CFG.block_chars,
            CFG.max_blocks,
            coarse_factor=CFG.coarse_factor,
        )
        for n in range(2)
    )
    assert first[: CFG.max_blocks] == second[: CFG.max_blocks]
    assert len(first) == CFG.max_blocks + 1  # the task is one partial coarse block


def test_a_prompt_within_the_fine_blocks_has_no_tail() -> None:
    assert tail(text(3, FINE_END)) == ()
    assert tail(text(3, 100)) == ()


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(0, 30_000), max_size=4))
def test_the_tail_does_not_depend_on_how_the_prompt_is_split(cuts: list[int]) -> None:
    whole = CONVERSATION[:30_000]
    bounds = [0, *sorted(cuts), len(whole)]
    pieces = [whole[a:b] for a, b in itertools.pairwise(bounds)]
    assert tail(*pieces) == tail(whole)


def test_non_ascii_text_has_a_tail_too() -> None:
    """A block of other text is hashed as UTF-16-LE under its own seed, as in the chain."""
    cjk = text(4, 30_000, alphabet="漢字かなカナ한글")
    assert tail(cjk) and tail(cjk)[-1] in tail(cjk + "続き" * 100)
    assert not set(tail(cjk)) & set(tail(CONVERSATION[:30_000]))


def test_the_tail_costs_a_bounded_number_of_fine_blocks() -> None:
    """At most ``(span + 1) × coarse_factor`` hashes, however long the prompt."""
    for size in (20_000, 200_000):
        assert len(tail(text(5, size))) <= (TAIL_SPAN + 1) * CFG.coarse_factor
