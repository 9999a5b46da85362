"""Deterministic prompt text for tests against a real model."""

from __future__ import annotations

import random

_WORDS = (
    "river",
    "stone",
    "lantern",
    "orchard",
    "copper",
    "meadow",
    "harbor",
    "violet",
    "thunder",
    "cedar",
    "glacier",
    "compass",
    "velvet",
    "ember",
    "falcon",
    "quarry",
    "saddle",
    "beacon",
    "willow",
    "prism",
)


def filler(seed: int, words: int) -> str:
    """``words`` words of seeded filler; Gemma's tokenizer makes about one token of each."""
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(words))
