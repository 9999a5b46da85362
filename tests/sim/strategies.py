"""Hypothesis strategies the simulator's property tests share."""

from __future__ import annotations

from hypothesis import strategies as st

from kvgate.workload.request import SimRequest

PROMPTS = st.lists(
    st.lists(st.tuples(st.integers(0, 6), st.integers(1, 12)), min_size=1, max_size=5),
    min_size=1,
    max_size=30,
)
"""Prompts as segment lists (segment id, tokens): few ids, so prompts share prefixes."""


def one_second_apart(prompts: list[list[tuple[int, int]]]) -> list[SimRequest]:
    """One request per prompt, a second apart, each asking one output token."""
    return [
        SimRequest.of(float(i), f"r{i}", tuple(segments), 1) for i, segments in enumerate(prompts)
    ]
