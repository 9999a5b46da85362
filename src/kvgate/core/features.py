"""Request features: what a policy may know about one request.

The hashing of prompts into prefix blocks lives in ``core.prefix``; this module
holds the feature record the driver builds once per request.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.types import BlockHash, Priority, SessionKey, SessionSource


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """Everything routing needs about one request; built once, before any I/O."""

    request_id: str
    model: str
    session_key: SessionKey | None = None
    session_source: SessionSource = SessionSource.NONE
    prefix_hashes: tuple[BlockHash, ...] = ()
    prompt_pieces: tuple[str, ...] = ()
    """The prompt's canonical text, in the pieces it was hashed from (references, not
    copies), so a policy can hash a span of it (``core.chain.span_hashes``): where past a
    whole block a prompt ends, which a later turn runs through. Empty in
    ``block_mode: tokens`` (a chain of token ids)."""
    prompt_chars: int = 0
    priority: Priority = Priority.STANDARD
    pinned_version: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    """The client's output limit (``max_tokens`` / ``max_completion_tokens``), if given."""
    checkpoints: tuple[int, ...] = ()
    """Indices of ``prefix_hashes`` whose worker bindings replicas share (``core.holders``)."""
    restorable_blocks: int = 0
    """Prefix blocks whose KV any worker can restore from disk (a llama.cpp slot the
    gateway saved in the folder every worker reads): worth almost as much everywhere."""

    @property
    def has_session(self) -> bool:
        """True when the client named a session (header or ``user`` field)."""
        return self.session_key is not None

    @property
    def affinity_key(self) -> SessionKey | None:
        """The key the driver looks up and writes affinity under.

        Only the client's own session key: a request without one is followed by its
        prefix blocks, never by a key derived from text strangers may share.
        """
        return self.session_key
