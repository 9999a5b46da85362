"""``Sequence``: the engine's mutable record of one request while it is live."""

from __future__ import annotations

from collections.abc import Sequence as SequenceT

from kvgate.engine.records import EngineRequest
from kvgate.types import BlockHash, Seconds


class Sequence:
    """One live request: its token progress and the KV blocks it holds.

    ``computed`` tokens have KV on the GPU; ``output`` tokens were produced. A
    sequence needs ``prompt + output - computed`` more tokens computed before it can
    produce its next token (the whole uncached prompt first, then one a step).
    ``held`` are the hashes of the hashed blocks it references, in chain order;
    its other ``num_blocks - len(held)`` blocks are private.
    """

    __slots__ = (
        "arrival",
        "cached_tokens",
        "computed",
        "first_token_time",
        "hashes",
        "held",
        "max_tokens",
        "n_hashable",
        "num_blocks",
        "order",
        "output",
        "preemptions",
        "prompt",
        "request",
        "request_id",
        "reserved",
        "scheduled",
    )

    def __init__(
        self, request: EngineRequest, arrival: Seconds, order: int, block_size: int, caching: bool
    ) -> None:
        self.request = request
        self.request_id = request.request_id
        self.arrival = arrival
        self.order = order
        self.prompt = request.prompt_tokens
        self.max_tokens = request.max_tokens
        self.hashes: SequenceT[BlockHash] = request.block_hashes
        full_blocks = request.prompt_tokens // block_size
        self.n_hashable = min(len(request.block_hashes), full_blocks) if caching else 0
        self.computed = 0
        self.output = 0
        self.num_blocks = 0
        self.held: list[BlockHash] = []
        self.reserved = 0
        self.scheduled = 0
        self.cached_tokens = -1
        self.first_token_time: Seconds = -1.0
        self.preemptions = 0

    @property
    def remaining_compute(self) -> int:
        """Tokens to compute before this sequence can produce its next token."""
        return self.prompt + self.output - self.computed

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, computed={self.computed}, output={self.output}"
            f"/{self.max_tokens}, blocks={self.num_blocks})"
        )
