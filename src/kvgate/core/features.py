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
    prompt_chars: int = 0
    priority: Priority = Priority.STANDARD
    pinned_version: str | None = None
    stream: bool = False
    prefix_key: SessionKey | None = None
    max_tokens: int | None = None
    """The client's output limit (``max_tokens`` / ``max_completion_tokens``), if given."""
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

        The client's session key when there is one, else ``prefix_key`` (a hash of
        the conversation's opening: system prompt plus first user message), so an
        agent that sends no key still sticks to the worker holding its cache.
        """
        return self.session_key if self.session_key is not None else self.prefix_key
