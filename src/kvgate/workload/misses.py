"""Where a run's cache misses went: each request's uncached prompt tokens, by cause.

A hit rate says how much was missed, not why. ``Misses`` follows every request
a run places (the simulated gateway's, or a live run's in client order,
``bench.misses``) and, when it finishes, splits the prompt tokens its worker had
to compute into:

- ``new``: text no earlier request had (its prompt and reply blocks, as the
  infinite-cache bound counts them): no router could have had it cached;
- ``shared``: text an earlier request had, on a request found to continue no
  earlier turn: a shared system prompt, document or opening recomputed on this
  worker (a copy made, or one evicted). On a trace whose later turns do not
  re-send their previous prompt whole (a Mooncake-format turn rewrites its
  predecessor's last block) and whose generator names no conversation, no turn
  is found, and every reuse counts here;
- ``turn_early``: a later turn placed before its previous turn had finished, so
  that turn's reply was in no cache yet: only open-loop arrivals make these
  (``kvgate sim --open-loop``; by default a turn waits for the reply it
  re-sends, ``sim.arrivals``), or a conversation whose turns overlap; no
  placement helps;
- ``turn_home``: a later turn whose previous turn's worker had lost (evicted)
  part of the conversation by the time the turn was placed, whether it was
  placed there or elsewhere: moving it lost nothing the home still had;
- ``turn_moved``: a later turn placed on another worker than its previous turn's,
  for what that worker still held when the turn was placed (what the move cost).
  Where the run cannot say what a worker holds (``placed`` given no ``held``),
  all of a moved turn's reuse counts here.

A request's *previous turn* is the last placed request of its conversation, where
the workload's generator names it (``SimRequest.conversation``: the truth, whether
or not the gateway is told). Otherwise it is the last placed request whose reply it
re-sends: its chain runs through the block that straddles that request's prompt and
reply (``PromptCodec.engine_blocks_with_reply``); a request with no reply (a
trace's completions prompt) ends at its prompt's last whole block instead, so a
later prompt that extends it whole is its next turn. The causes add up to the misses:
``100 - sum(points) == hit rate`` in percent, over the requests that finished.

The earlier requests are those placed earlier (the bound counts in arrival order;
a request that waited in the queue may be placed after one that arrived later).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.types import BlockHash

CAUSES = ("new", "shared", "turn_early", "turn_home", "turn_moved")
"""The causes a missed prompt token is put down to, in report order."""


@dataclass(frozen=True, slots=True)
class _Placed:
    prompt_tokens: int
    seen_tokens: int  # leading prompt tokens some earlier request had (whole blocks)
    cause: str  # what the misses within ``seen_tokens`` are put down to
    kept: int  # of a moved turn, the tokens its previous worker held at placement (-1: unknown)


class Misses:
    """The causes of one run's uncached prompt tokens (see the module docs)."""

    __slots__ = ("_block_size", "_done", "_ends", "_last", "_placed", "_seen", "prompt_tokens",
                 "requests", "tokens")  # fmt: skip

    def __init__(self, block_size: int) -> None:
        self._block_size = block_size
        self._seen: set[BlockHash] = set()
        # The block a next turn's chain runs through -> (request id, worker) of that turn.
        self._ends: dict[BlockHash, tuple[str, str]] = {}
        # A named conversation -> (request id, worker) of its last turn placed.
        self._last: dict[str, tuple[str, str]] = {}
        self._done: set[str] = set()
        self._placed: dict[str, _Placed] = {}
        self.prompt_tokens = 0
        self.tokens = dict.fromkeys(CAUSES, 0)
        """Prompt tokens computed, by cause, over the requests finished."""
        self.requests = dict.fromkeys(CAUSES, 0)
        """Requests finished that missed at least one token for the cause."""

    def placed(
        self,
        request_id: str,
        worker: str,
        prompt_tokens: int,
        chain: Sequence[BlockHash],
        reply: Sequence[BlockHash],
        *,
        conversation: str | None = None,
        held: Callable[[str], int] | None = None,
    ) -> None:
        """A request was sent to ``worker`` with its prompt's and reply's block chains,
        as a turn of ``conversation`` where the workload names it; ``held(w)``: how
        many of its prompt tokens worker ``w`` holds in its cache now."""
        seen, ends, size = self._seen, self._ends, self._block_size
        limit = min(len(chain), (prompt_tokens - 1) // size)  # the engine's hit rule
        hits = 0
        while hits < limit and chain[hits] in seen:
            hits += 1
        previous = None
        if conversation is not None:
            previous = self._last.get(conversation)
            self._last[conversation] = (request_id, worker)
        else:
            for block in reversed(chain):
                previous = ends.get(block)
                if previous is not None:
                    break
        kept = -1
        if previous is None:
            cause = "shared"
        elif previous[0] not in self._done:
            cause = "turn_early"
        elif previous[1] == worker:
            cause = "turn_home"
        else:
            cause = "turn_moved"
            kept = held(previous[1]) if held is not None else -1
        self._placed[request_id] = _Placed(prompt_tokens, hits * size, cause, kept)
        seen.update(chain)
        seen.update(reply)
        end = reply[0] if reply else chain[-1] if chain else None
        if end is not None:
            ends[end] = (request_id, worker)

    def finished(self, request_id: str, cached_tokens: int) -> None:
        """A placed request finished with ``cached_tokens`` of its prompt from the cache."""
        placed = self._placed.pop(request_id, None)
        self._done.add(request_id)
        if placed is None:
            return
        prompt, seen = placed.prompt_tokens, placed.seen_tokens
        cached = min(cached_tokens, prompt)
        self.prompt_tokens += prompt
        avoidable = max(0, seen - cached)
        new = prompt - cached - avoidable
        kept = placed.kept  # known only for a moved turn
        # A moved turn lost only what its previous worker still held; the rest was gone.
        moved = avoidable if kept < 0 else min(avoidable, max(0, kept - cached))
        causes = (("new", new), (placed.cause, moved), ("turn_home", avoidable - moved))
        for cause, tokens in causes:
            if tokens > 0:
                self.tokens[cause] += tokens
                self.requests[cause] += 1

    def summary(self) -> dict[str, Any]:
        """Tokens, points of the prompt tokens, and requests, by cause."""
        total = self.prompt_tokens
        return {
            "prompt_tokens": total,
            "tokens": dict(self.tokens),
            "points": {
                cause: round(100.0 * n / total, 4) if total else 0.0
                for cause, n in self.tokens.items()
            },
            "requests": dict(self.requests),
        }
