"""Tokenizing a rendered chat span by span, each span remembered.

A Hugging Face tokenizer cuts its input at its added tokens (``<|im_end|>``,
``<end_of_turn>``, Gemma's ``\\n``) before anything else, and tokenizes the text
between them one piece at a time: the ids of a prompt are the ids of its pieces in
order. A chat template writes added tokens between messages, so a conversation's
next turn is the same pieces as its last turn plus a few new ones. Cutting at the
added tokens the template writes (and at any added token containing one, so the
longest match wins as the tokenizer's does) and remembering each piece's ids, a
later turn tokenizes only what is new: a 4k-token conversation's next turn costs
its new message, not 4k tokens (``benchmarks/kv_events_bench.py``).

Cutting is exact only where added tokens are matched as plain text (no
``lstrip``/``rstrip``/``single_word``, not normalized): for any other tokenizer
the prompt is tokenized whole.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

MAX_CHARS = 8 << 20
"""Characters of remembered pieces at most (least recently used forgotten first)."""


class Spans:
    """``encode(text)``: the tokenizer's ids of ``text`` without special tokens added
    (``encode``: what tokenizes a piece, ``tokenizer``'s own encoding by default)."""

    def __init__(
        self,
        tokenizer: Any,
        written: Iterable[str],
        max_chars: int = MAX_CHARS,
        encode: Callable[[str], list[int]] | None = None,
    ) -> None:
        self._encode: Callable[[str], list[int]] = encode or (
            lambda text: tokenizer.encode(text, add_special_tokens=False).ids
        )
        decoder = tokenizer.get_added_tokens_decoder()
        self._ids = {token.content: i for i, token in decoder.items()}
        plain = all(
            not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in decoder.values()
        )
        written = [w for w in written if w]
        # The added tokens the template writes, and every added token holding one.
        marks = {c for c in self._ids if any(c in w for w in written)}
        cuts = {c for c in self._ids if any(m in c for m in marks)}
        self._pattern = (
            re.compile("|".join(re.escape(c) for c in sorted(cuts, key=len, reverse=True)))
            if plain and cuts
            else None
        )
        self._known: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self._max_chars = max_chars
        self.hits = 0
        self.misses = 0

    @property
    def cutting(self) -> bool:
        """Whether prompts are cut into remembered pieces (else tokenized whole)."""
        return self._pattern is not None

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, piece by piece (see the module docs)."""
        pattern = self._pattern
        if pattern is None:
            return list(self._encode(text))
        ids: list[int] = []
        start = 0
        added = self._ids
        for match in pattern.finditer(text):
            if match.start() > start:
                ids.extend(self._piece(text[start : match.start()]))
            ids.append(added[match.group()])
            start = match.end()
        if start < len(text):
            ids.extend(self._piece(text[start:]))
        return ids

    def _piece(self, piece: str) -> list[int]:
        known = self._known
        found = known.get(piece)
        if found is not None:
            known.move_to_end(piece)
            self.hits += 1
            return found
        self.misses += 1
        ids = self._encode(piece)
        known[piece] = ids
        self._chars += len(piece)
        while self._chars > self._max_chars and known:
            gone, _ = known.popitem(last=False)
            self._chars -= len(gone)
        return ids


def written_by(render: Callable[[list[dict[str, str]]], str]) -> set[str]:
    """The text a chat template writes around its messages (placeholders cut out)."""
    mark = "\x00"
    written: set[str] = set()
    for roles in (("system", "user", "assistant", "user"), ("user", "assistant", "user")):
        try:
            text = render([{"role": role, "content": mark} for role in roles])
        except Exception:
            continue
        written.update(part for part in text.split(mark) if part)
    return written
