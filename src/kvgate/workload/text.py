"""The pseudo-text of prompt segments: same id, same text; one token per four characters.

Shared by the prompt codec (the simulator's features), the payload builder (live
replay) and the tests, so both sides hash text that exists and agrees.
"""

from __future__ import annotations

import functools

CHARS_PER_TOKEN = 4
"""Characters of pseudo-text per token (about English's ratio for BPE tokenizers)."""


_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_WORDS = len(_LETTERS) ** 3
_SCRAMBLE = 7_919  # odd and prime to 13: a bijection on 0.._WORDS-1, so words look mixed


def _word(digit: int, last: bool) -> str:
    """One 3-letter word and its space: a single token of ``engine.tokenizer`` (4 chars)."""
    n = digit * _SCRAMBLE % _WORDS
    word = _LETTERS[n // 676] + _LETTERS[n // 26 % 26] + _LETTERS[n % 26]
    return (word.capitalize() if last else word) + " "


@functools.lru_cache(maxsize=65_536)
def _segment_unit(segment_id: int) -> str:
    """The words a segment's text repeats: its id in base 26**3, lowest digit first.

    Ids are zig-zagged (traces use negative ids for unshared tails) and the last word
    is capitalised, which makes the units a prefix code: two ids' repeated units
    differ within the longer unit, and consecutive ids differ in their first word.
    """
    n = 2 * segment_id if segment_id >= 0 else -2 * segment_id - 1
    words: list[str] = []
    while True:
        n, digit = divmod(n, _WORDS)
        words.append(_word(digit, last=n == 0))
        if n == 0:
            return "".join(words)


def segment_text(segment_id: int, chars: int) -> str:
    """The pseudo-text of a segment: deterministic, and distinct for distinct ids.

    Words of three letters and a space, so the engine's tokenizer reads exactly one
    token per ``CHARS_PER_TOKEN`` characters, as the workload's token counts assume.
    """
    unit = _segment_unit(segment_id)
    return (unit * (chars // len(unit) + 1))[:chars]
