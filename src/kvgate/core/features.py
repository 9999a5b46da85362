"""Request features: what a policy may know about one request.

The hashing of prompts into prefix blocks lives in ``core.prefix``; this module
holds the feature record the driver builds once per request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvgate.types import BlockHash, Priority, SessionKey, SessionSource, WorkerId


@dataclass(frozen=True)
class RequestFeatures:
    """Everything routing needs about one request; built once, before any I/O.

    No ``slots``: the request path makes its one a request with ``request_features``,
    in one update of the instance dict (reads cost the same).
    """

    request_id: str
    model: str
    session_key: SessionKey | None = None
    # Defaulted by factories, so the class holds no Enum member by these names: CPython
    # (3.11) does not specialize loads of an attribute the class shadows with an object
    # of a mutable type (an Enum's), ~250 more instructions a read (``fleet.WorkerState``).
    session_source: SessionSource = field(default_factory=lambda: SessionSource.NONE)
    prefix_hashes: tuple[BlockHash, ...] = ()
    prompt_pieces: tuple[str, ...] = ()
    """The prompt's canonical text, in the pieces it was hashed from (references, not
    copies), so a policy can hash a span of it (``core.chain.span_hashes``): where past a
    whole block a prompt ends, which a later turn runs through. Empty in
    ``block_mode: tokens`` (a chain of token ids)."""
    prompt_chars: int = 0
    priority: Priority = field(default_factory=lambda: Priority.STANDARD)
    pinned_version: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    """The client's output limit (``max_tokens`` / ``max_completion_tokens``), if given."""
    checkpoints: tuple[int, ...] = ()
    """Indices of ``prefix_hashes`` whose worker bindings replicas share (``core.holders``)."""
    restorable_blocks: int = 0
    """Prefix blocks whose KV any worker can restore from disk (a llama.cpp slot the
    gateway saved in the folder every worker reads): worth almost as much everywhere."""
    parent_key: SessionKey | None = None
    """The parent session a subagent's request names (``core.session.PARENT_SESSION_HEADERS``):
    until the subagent has a binding of its own, it routes under its parent's
    (``core.route.under_parent``)."""
    token_ids: tuple[int, ...] = ()
    """The prompt as the engine's tokens (``tokenizers:``; empty without a tokenizer):
    looked up in the exact index (``core.exact_index``)."""
    slot_shares: tuple[tuple[WorkerId, int, str], ...] = ()
    """Per llama.cpp worker, the prefix blocks a slot there holds or is computing for this
    request (the slot plane gives it that slot: ``gateway.control.offload``), and the id of
    the request in flight computing them, which it waits for ("": an idle slot)."""
    tenant: str = ""
    """The tenant its scope counts under in the store (``core.session.tenant_tag``; "": no
    scope): the prefix blocks it shares are counted against it (``store.holders``)."""
    slot_uncached: tuple[tuple[WorkerId, int, float], ...] = ()
    """Per llama.cpp worker, the prompt tokens the slot plane expects the engine to compute
    there, in the engine's own tokens, and the seconds it takes before the engine has them
    (a save, a restore: ``core.slot_turns``; empty: it cannot tell)."""

    def slot_tokens(self, worker: WorkerId, guess: float) -> tuple[float, float]:
        """The tokens the slot plane expects ``worker`` to compute of this prompt and the
        seconds before it sends it, else ``guess`` and none (the policy's own guess: the
        plane has no word on that worker)."""
        for wid, tokens, setup in self.slot_uncached:
            if wid == worker:
                return tokens, setup
        return guess, 0.0

    def slot_credit(self, worker: WorkerId, chars: Callable[[int], int]) -> tuple[int, str]:
        """Characters of the prompt the slot plane finds for it on ``worker`` (restored from
        disk: ``restorable_blocks``, or in a slot there: ``slot_shares``; ``chars``: blocks
        to characters), and the request it waits for there ("": none)."""
        blocks, after = self.restorable_blocks, ""
        for wid, held, computing in self.slot_shares:
            if wid == worker and held > blocks:
                blocks, after = held, computing
        found = chars(blocks) if blocks else 0
        return (found if found < self.prompt_chars else self.prompt_chars), after

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


_new = object.__new__


def request_features(
    request_id: str,
    model: str,
    *,
    session_key: SessionKey | None = None,
    session_source: SessionSource = SessionSource.NONE,
    prefix_hashes: tuple[BlockHash, ...] = (),
    prompt_pieces: tuple[str, ...] = (),
    prompt_chars: int = 0,
    priority: Priority = Priority.STANDARD,
    pinned_version: str | None = None,
    stream: bool = False,
    max_tokens: int | None = None,
    checkpoints: tuple[int, ...] = (),
    restorable_blocks: int = 0,
    parent_key: SessionKey | None = None,
    token_ids: tuple[int, ...] = (),
    slot_shares: tuple[tuple[WorkerId, int, str], ...] = (),
    tenant: str = "",
    slot_uncached: tuple[tuple[WorkerId, int, float], ...] = (),
) -> RequestFeatures:
    """``RequestFeatures(...)``, equal to it, made without the frozen ``__init__``.

    That ``__init__`` sets each of the 18 fields through ``object.__setattr__``
    (about 1 us, some 1% of a plain request's instructions); this fills the new
    instance's dict in one update. ``tests/core/test_features.py`` checks that the
    parameters and defaults are the fields'.
    """
    made = _new(RequestFeatures)
    made.__dict__.update(
        request_id=request_id,
        model=model,
        session_key=session_key,
        session_source=session_source,
        prefix_hashes=prefix_hashes,
        prompt_pieces=prompt_pieces,
        prompt_chars=prompt_chars,
        priority=priority,
        pinned_version=pinned_version,
        stream=stream,
        max_tokens=max_tokens,
        checkpoints=checkpoints,
        restorable_blocks=restorable_blocks,
        parent_key=parent_key,
        token_ids=token_ids,
        slot_shares=slot_shares,
        tenant=tenant,
        slot_uncached=slot_uncached,
    )
    return made
