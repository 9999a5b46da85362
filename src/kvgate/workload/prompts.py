"""Prompt structure to hashes: the engine's token blocks and the gateway's text blocks.

A simulated prompt is a sequence of segments ``(id, tokens)``. Each segment
stands for a deterministic pseudo-text of ``tokens * chars_per_token``
characters (same id, same text), so the gateway's features are computed by the
real ``kvgate.core.prefix`` functions over text that exists, and the engine's
block chain covers the same content in ``block_size``-token blocks: both sides
agree on which prompts share which prefix.

The gateway's features are built exactly as live: the request becomes the body
live replay would send, and ``build_features`` reads it. The engine's chain is
computed segment by segment from a *state* (the chain so far and the partial
block left over) and memoised per ``(state, segment)``, since hashing every
prompt from scratch would dominate the simulator. The state determines
everything after it, so the memo can be cleared at any moment (it is, when it
reaches its size bound) without changing any result.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.core.features import RequestFeatures
from kvgate.core.prefix import FeatureConfig, build_features
from kvgate.types import BlockHash
from kvgate.workload.payloads import PayloadBuilder
from kvgate.workload.request import Segment, SimRequest
from kvgate.workload.text import CHARS_PER_TOKEN, segment_text

__all__ = ["CHARS_PER_TOKEN", "PromptCodec", "segment_text"]

_Piece = tuple[int, int, int]  # (segment id, first token, end token) inside one block
OUTPUT_SEGMENT = -1
"""The segment id of an output no later prompt re-sends (a request without a ``reply``).

Its blocks continue the prompt's chain, so they are that prompt's own: the emulated
worker's output is a filler decided by the prompt and ``max_tokens``, and vLLM caches
generated blocks as it caches the prompt's. Workload segment ids are never negative."""
_TokenState = tuple[int, tuple[_Piece, ...], int]  # (chain hash, partial pieces, fill)


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
        self._payloads = PayloadBuilder(
            model,
            chars_per_token=chars_per_token,
            session_header=self.features.session_header,
            priority_header=self.features.priority_header,
            memo_limit=min(memo_limit, 50_000),
        )

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
        chain, more, _ = self.engine_blocks_with_output(segments, reply, 0)
        return chain, more

    def engine_blocks_with_output(
        self, segments: Sequence[Segment], reply: Segment | None, output_tokens: int
    ) -> tuple[list[BlockHash], list[BlockHash], list[BlockHash]]:
        """The prompt's chain, the reply's continuation, and the blocks the engine caches
        past the prompt when the request finishes, from one walk of the prompt.

        The last is the reply's continuation when a next turn re-sends it; otherwise
        ``output_tokens`` of the request's own output (``OUTPUT_SEGMENT``), which nothing
        later hits but which takes the room in the cache it takes live: a trace's answers
        evict others' history too. The reply's continuation is empty without a reply.
        """
        state, chain = self._token_chain(segments)
        if reply is not None:
            more = self._token_chain((reply,), state)[1]
            return chain, more, more
        if output_tokens <= 0:
            return chain, [], []
        return chain, [], self._token_chain(((OUTPUT_SEGMENT, output_tokens),), state)[1]

    # -- gateway side ------------------------------------------------------------

    def features_of(self, request: SimRequest) -> RequestFeatures:
        """The ``RequestFeatures`` the gateway builds for this request, by the same function.

        The request becomes the body and headers live replay sends
        (``workload.payloads``), and ``core.prefix.build_features`` reads them, so a
        change to features cannot make the simulator and the gateway drift apart.
        """
        payload = self._payloads.payload(request)
        return build_features(
            payload.body,
            payload.headers,
            self.features,
            request_id=request.request_id,
            endpoint="chat" if payload.chat else "completions",
        )
