"""Tokenizing a rendered chat span by span, each span remembered.

A Hugging Face tokenizer cuts its input at its added tokens (``<|im_end|>``,
``<end_of_turn>``, Gemma's ``\\n``) before anything else, and tokenizes the text
between them one piece at a time: the ids of a prompt are the ids of its pieces in
order, and the ids of a run of pieces and cuts from one cut to another are the ids of
its text. A chat template writes added tokens between messages, so a conversation's
next turn is the same messages as its last turn plus a few new ones. Cutting at the
added tokens the template writes (and at any added token containing one, so the
longest match wins as the tokenizer's does), grouping the pieces from one message's
opening to the next (what the template writes right after a cut, before a message)
and remembering each group's ids, a later turn tokenizes only what is new: a
4k-token conversation's next turn costs its new message, not 4k tokens
(``benchmarks/kv_events_bench.py``).

Cutting is exact only where added tokens are matched as plain text (no
``lstrip``/``rstrip``/``single_word``, not normalized): for any other tokenizer
the prompt is tokenized whole.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

MAX_CHARS = 8 << 20
"""Characters of remembered pieces at most (least recently used forgotten first)."""


class Spans:
    """``encode(text)``: the tokenizer's ids of ``text`` without special tokens added
    (``encode``: what tokenizes a piece; ``added``: the added tokens' ids by their text,
    ``plain``: whether all are matched as plain text, ``tokens.reference``)."""

    def __init__(
        self,
        added: Mapping[str, int],
        written: Iterable[str],
        encode: Callable[[str], list[int]],
        *,
        plain: bool,
        max_chars: int = MAX_CHARS,
    ) -> None:
        self._encode = encode
        self._ids = dict(added)
        written = [w for w in written if w]
        # The added tokens the template writes, and every added token holding one.
        marks = {c for c in self._ids if any(c in w for w in written)}
        cuts = {c for c in self._ids if any(m in c for m in marks)}
        self._pattern = re.compile(f"({longest_of(cuts)})") if plain and cuts else None
        # What the template writes right after a cut, opening a message ("<|im_start|>user"
        # after ChatML's "\n"): a prompt's pieces are grouped from one opening to the next.
        pattern = self._pattern
        self._openers = tuple(
            sorted({after for w in written for after in pattern.split(w)[2::2] if after})
            if pattern is not None
            else ()
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
        """``text``'s ids, message by message (see the module docs)."""
        pattern = self._pattern
        if pattern is None:
            return list(self._encode(text))
        parts = pattern.split(text)  # the pieces, the added tokens cut out between them
        added, openers = self._ids, self._openers
        ids: list[int] = []
        if not openers:  # every piece on its own
            for n, part in enumerate(parts):
                if n & 1:
                    ids.append(added[part])
                elif part:
                    ids += self._piece(part)
            return ids
        # A message's lines in one call: a code prompt has hundreds, and each call has
        # its fixed cost (fastokens: ~4 µs, as much as 60 tokens of a long text).
        start = 0
        for n in range(1, len(parts), 2):
            if parts[n + 1].startswith(openers):
                if n - start > 1 or parts[start]:
                    ids += self._piece("".join(parts[start:n]))
                ids.append(added[parts[n]])
                start = n + 1
        rest = "".join(parts[start:])
        if rest:
            ids += self._piece(rest)
        return ids

    def _piece(self, piece: str) -> list[int]:
        found = self._known.get(piece)
        if found is None:
            return self._learn(piece)
        self._known.move_to_end(piece)
        self.hits += 1
        return found

    def _learn(self, piece: str) -> list[int]:
        self.misses += 1
        ids = self._encode(piece)
        known = self._known
        known[piece] = ids
        self._chars += len(piece)
        while self._chars > self._max_chars and known:
            gone, _ = known.popitem(last=False)
            self._chars -= len(gone)
        return ids


def longest_of(words: Iterable[str]) -> str:
    """A regex matching the longest of ``words`` that starts where it matches, as a
    trie: one character compared per step, where an alternation of the words would try
    each in turn (Gemma's 31 runs of newlines: 160 µs a 4k-token code prompt, 15 µs)."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = True  # a word ends here

    def pattern(node: dict[str, Any]) -> str:
        branches = [re.escape(c) + pattern(child) for c, child in sorted(node.items()) if c]
        if not branches:
            return ""
        inner = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        # Greedy: the longer word first, this node's own word if it is one.
        return f"(?:{inner})?" if "" in node else inner

    return pattern(trie)


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
