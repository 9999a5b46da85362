"""Prompt structure to hashes: the engine's token blocks and the gateway's text blocks.

A simulated prompt is a sequence of segments ``(id, tokens)``. Each segment
stands for a deterministic pseudo-text of ``tokens * chars_per_token``
characters (same id, same text), so the gateway's features are computed by the
real ``kvgate.core.prefix`` functions over text that exists, and the engine's
block chain covers the same content in ``block_size``-token blocks: both sides
agree on which prompts share which prefix.

Hashing a prompt from scratch for every request would dominate the simulator,
so both chains are computed segment by segment from a *state* (the chain so far
and the partial block left over) and memoised per ``(state, segment)``. The
state determines everything after it, so the memo can be cleared at any moment
(it is, when it reaches its size bound) without changing any result.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from kvgate.core.features import RequestFeatures
from kvgate.core.prefix import FeatureConfig, text_chain_hashes
from kvgate.core.session import normalize_key, prefix_key_for
from kvgate.types import BlockHash, SessionKey, SessionSource
from kvgate.workload.request import Segment, SimRequest

CHARS_PER_TOKEN = 4
"""Characters of pseudo-text per token (about English's ratio for BPE tokenizers)."""

_Piece = tuple[int, int, int]  # (segment id, first token, end token) inside one block
_TokenState = tuple[int, tuple[_Piece, ...], int]  # (chain hash, partial pieces, fill)
_TextState = tuple[int, int, str]  # (blocks emitted, chain hash, partial text)


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


def _piece_hash(prev: int, pieces: tuple[_Piece, ...]) -> int:
    # Tuples of ints hash the same in every process (only str and bytes hashing is
    # salted), and this is several times faster than packing bytes for xxhash.
    return hash((prev, pieces))


class PromptCodec:
    """Hashes for simulated prompts, memoised; one per simulation run.

    ``block_size`` is the engine's (tokens); ``features`` the gateway's feature
    config (``block_chars``, ``max_blocks``, ``hash_seed``, session keys).
    """

    def __init__(
        self,
        block_size: int,
        features: FeatureConfig | None = None,
        *,
        model: str = "sim",
        chars_per_token: int = CHARS_PER_TOKEN,
        memo_limit: int = 200_000,
    ) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self.features = features if features is not None else FeatureConfig.model_validate({})
        if self.features.block_mode != "chars":
            raise ValueError("the simulator computes features in block_mode 'chars'")
        self.model = model
        self.chars_per_token = chars_per_token
        self.memo_limit = memo_limit
        self._token_memo: dict[tuple[_TokenState, Segment], tuple[_TokenState, tuple[int, ...]]]
        self._token_memo = {}
        self._text_memo: dict[tuple[_TextState, Segment], tuple[_TextState, tuple[int, ...]]]
        self._text_memo = {}
        self._partial_memo: dict[_TextState, int] = {}
        self._key_memo: dict[tuple[Segment, ...], SessionKey | None] = {}

    # -- engine side -------------------------------------------------------------

    def _token_step(
        self, state: _TokenState, segment: Segment
    ) -> tuple[_TokenState, tuple[int, ...]]:
        memo_key = (state, segment)
        found = self._token_memo.get(memo_key)
        if found is not None:
            return found
        prev, pieces, fill = state
        seg_id, tokens = segment
        size = self.block_size
        emitted: list[int] = []
        pos = 0
        while pos < tokens:
            take = min(size - fill, tokens - pos)
            pieces = (*pieces, (seg_id, pos, pos + take))
            fill += take
            pos += take
            if fill == size:
                prev = _piece_hash(prev, pieces)
                emitted.append(prev)
                pieces, fill = (), 0
        result = ((prev, pieces, fill), tuple(emitted))
        if len(self._token_memo) >= self.memo_limit:
            self._token_memo.clear()
        self._token_memo[memo_key] = result
        return result

    def _token_chain(
        self, segments: Sequence[Segment], state: _TokenState = (0, (), 0)
    ) -> tuple[_TokenState, list[int]]:
        chain: list[int] = []
        memo = self._token_memo
        for segment in segments:
            # The memo lookup is inlined: this loop runs for every segment of every request.
            found = memo.get((state, segment))
            state, emitted = found if found is not None else self._token_step(state, segment)
            chain.extend(emitted)
        return state, chain

    def engine_blocks(self, segments: Sequence[Segment]) -> list[BlockHash]:
        """The prompt's full ``block_size``-token blocks as a hash chain (block i covers 0..i)."""
        return self._token_chain(segments)[1]

    def engine_blocks_with_reply(
        self, segments: Sequence[Segment], reply: Segment | None
    ) -> tuple[list[BlockHash], list[BlockHash]]:
        """The prompt's chain, and the chain's continuation over the reply's full blocks.

        The continuation starts with the block straddling prompt and reply, which is
        what ``EngineRequest.output_block_hashes`` expects.
        """
        state, chain = self._token_chain(segments)
        if reply is None:
            return chain, []
        _, more = self._token_chain((reply,), state)
        return chain, more

    # -- gateway side ------------------------------------------------------------

    def _text_step(self, state: _TextState, segment: Segment) -> tuple[_TextState, tuple[int, ...]]:
        memo_key = (state, segment)
        found = self._text_memo.get(memo_key)
        if found is not None:
            return found
        count, prev, partial = state
        cfg = self.features
        width = cfg.block_chars
        text = partial + segment_text(segment[0], segment[1] * self.chars_per_token)
        full = min(len(text) // width, cfg.max_blocks - count)
        emitted = text_chain_hashes(text[: full * width], width, full, prev) if full > 0 else ()
        if emitted:
            prev = emitted[-1]
        rest = text[full * width :] if count + full < cfg.max_blocks else ""
        result = ((count + full, prev, rest[:width]), emitted)
        if len(self._text_memo) >= self.memo_limit:
            self._text_memo.clear()
        self._text_memo[memo_key] = result
        return result

    def text_hashes(self, segments: Sequence[Segment]) -> tuple[BlockHash, ...]:
        """``core.prefix.text_chain_hashes`` of the prompt's pseudo-text, computed in pieces."""
        max_blocks = self.features.max_blocks
        state: _TextState = (0, self.features.hash_seed, "")
        chain: list[int] = []
        memo = self._text_memo
        for segment in segments:
            if state[0] >= max_blocks:
                break
            found = memo.get((state, segment))
            state, emitted = found if found is not None else self._text_step(state, segment)
            chain.extend(emitted)
        count, prev, partial = state
        if partial and count < max_blocks:
            # The gateway hashes the trailing partial block too.
            tail = self._partial_memo.get(state)
            if tail is None:
                tail = text_chain_hashes(partial, len(partial), 1, prev)[0]
                if len(self._partial_memo) >= self.memo_limit:
                    self._partial_memo.clear()
                self._partial_memo[state] = tail
            chain.append(tail)
        return tuple(chain)

    def prefix_key(self, request: SimRequest) -> SessionKey | None:
        """The session key the gateway derives from the conversation's opening text."""
        cfg = self.features
        limit_chars = cfg.block_chars * cfg.max_blocks
        if request.opening > 0:
            opening = request.segments[: request.opening]
        else:
            limit_chars = min(limit_chars, cfg.prefix_key_chars)
            opening = self._leading(request.segments, limit_chars)
        if opening in self._key_memo:
            return self._key_memo[opening]
        text = "".join(segment_text(i, t * self.chars_per_token) for i, t in opening)
        key = prefix_key_for(text[:limit_chars], cfg.hash_seed)
        if len(self._key_memo) >= self.memo_limit:
            self._key_memo.clear()
        self._key_memo[opening] = key
        return key

    def _leading(self, segments: Sequence[Segment], chars: int) -> tuple[Segment, ...]:
        """The fewest leading segments covering ``chars`` characters (the last one cut)."""
        out: list[Segment] = []
        covered = 0
        for seg_id, tokens in segments:
            if covered >= chars:
                break
            room = -(-(chars - covered) // self.chars_per_token)
            out.append((seg_id, min(tokens, room)))
            covered += min(tokens, room) * self.chars_per_token
        return tuple(out)

    def features_of(self, request: SimRequest) -> RequestFeatures:
        """The ``RequestFeatures`` the gateway would build for this request's body."""
        cfg = self.features
        session_key: SessionKey | None = None
        source = SessionSource.NONE
        if request.session_id:
            # Sent as the session header, which the gateway reads first.
            session_key = normalize_key(request.session_id, cfg.max_session_key_chars)
            source = SessionSource.HEADER if session_key is not None else SessionSource.NONE
        prefix_key = None
        if session_key is None and cfg.derive_prefix_key:
            prefix_key = self.prefix_key(request)
        return RequestFeatures(
            request_id=request.request_id,
            model=self.model,
            session_key=session_key,
            session_source=source,
            prefix_hashes=self.text_hashes(request.segments),
            prompt_chars=request.prompt_tokens * self.chars_per_token,
            priority=request.priority,
            prefix_key=prefix_key,
            max_tokens=request.max_tokens,
        )
