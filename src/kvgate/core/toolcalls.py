"""Sessions away on a tool call: how long tool calls last, and whose KV is spoken for.

An agent's turn that ends in a tool call (``finish_reason: tool_calls``, ``stop_reason:
tool_use``) says the session is coming back, with the tool's result appended to
everything its worker already holds. While it is away its KV sits idle in the
worker's cache, first in line for LRU eviction. Two things follow, both pure:

- ``ToolPauses`` learns how long the fleet's tool calls last (the time from a turn's
  end in a tool call to the session's next request), as a bounded sample of the most
  recent pauses; its ``horizon`` (a high quantile, ``quantile``) is how long an away
  session's KV is worth keeping. Until ``min_samples`` pauses were seen, ``prior_s``.
- ``leaves_away`` says from an attempt's end (``core.attempt.AttemptEnd``) whether its
  session is away and with how much KV, so every data plane (the proxy, the endpoint
  picker, the simulator) books it on every path through the one end of the attempt.
- ``AwaySessions`` books each session away: its worker, the KV tokens it holds there,
  since when. ``reserved`` sums, per worker, the KV of sessions away for less than the
  horizon: the eviction cost of placing other work there counts it as taken (a policy
  adds it to the worker's fill). A session that returns leaves the book, and its pause
  teaches the estimator; one away past the horizon is taken as gone. ``offload_due``
  names the sessions away on a worker at ``OFFLOAD_AT`` KV use or more that were not yet
  offloaded: their KV is copied to the worker's lossless tier (its CPU tier, a llama.cpp
  slot file), to be restored when they return, if evicted meanwhile, instead of recomputed.

Times are passed in (the driver's clock); nothing here does I/O.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from dataclasses import dataclass

from kvgate.core.attempt import AttemptEnd, EndKind
from kvgate.types import Seconds, SessionKey, WorkerId

__all__ = ["OFFLOAD_AT", "Away", "AwaySessions", "ToolPauses", "leaves_away"]

OFFLOAD_AT = 0.0
"""KV use at which an away session's KV goes to its worker's lossless tier: any. The tier
keeps a copy (the GPU's stays usable until evicted), so the copy costs no GPU room and no
restore when the KV survives the pause, and a restore (PCIe: ~5 ms per 1k tokens of an 8B
model) instead of a recompute (~80 ms per 1k tokens) when it does not. Only a worker with
such a tier is asked (an offload elsewhere drops the KV). On agent-tools (tuning seeds 1-8,
900 blocks + 8,000 CPU blocks) a copy rather than a move cut returning turns' TTFT p50 by
30% (77 -> 52 ms, every seed), p99 and hit rate unchanged."""


def leaves_away(end: AttemptEnd) -> int | None:
    """The KV tokens a session holds on ``end.worker`` once its attempt ended so, when that
    leaves it away on a tool call (else ``None``): its answer ended calling a tool and the
    client has it, completed or cancelled past its usage (a client that went at the end of
    the stream). A failed attempt leaves nothing away: its client never got the call and
    sends the turn again."""
    if not end.tool_call:
        return None
    if end.kind is _FAILED or (end.kind is _CANCELLED and end.prompt_tokens is None):
        return None
    return (end.prompt_tokens or 0) + (end.completion_tokens or 0)


_FAILED, _CANCELLED = EndKind.FAILED, EndKind.CANCELLED


class ToolPauses:
    """The fleet's recent tool-call durations, and the horizon an away session is kept for."""

    def __init__(
        self,
        *,
        capacity: int = 512,
        quantile: float = 0.9,
        prior_s: Seconds = 30.0,
        min_samples: int = 8,
    ) -> None:
        if not 0.0 < quantile <= 1.0:
            raise ValueError("quantile must be in (0, 1]")
        self.quantile = quantile
        self.prior_s = prior_s
        self.min_samples = min_samples
        self._recent: deque[Seconds] = deque(maxlen=max(1, capacity))
        self._sorted: list[Seconds] = []

    def observe(self, seconds: Seconds) -> None:
        """One tool call lasted ``seconds`` (its session came back after that long)."""
        if seconds < 0.0:
            return
        recent = self._recent
        if len(recent) == recent.maxlen:
            old = recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        recent.append(seconds)
        bisect.insort(self._sorted, seconds)

    @property
    def samples(self) -> int:
        """Pauses in the sample."""
        return len(self._sorted)

    def horizon(self) -> Seconds:
        """How long an away session is expected back within (the ``quantile`` of pauses)."""
        ranked = self._sorted
        if len(ranked) < self.min_samples:
            return self.prior_s
        at = min(len(ranked) - 1, int(self.quantile * len(ranked)))
        return ranked[at]

    def back_within(self, seconds: Seconds) -> float:
        """The share of pauses that ended within ``seconds`` (the prior: a step at it)."""
        ranked = self._sorted
        if len(ranked) < self.min_samples:
            return 1.0 if seconds >= self.prior_s else 0.0
        return bisect.bisect_right(ranked, seconds) / len(ranked)


@dataclass(slots=True)
class Away:
    """One session away on a tool call."""

    worker: WorkerId
    kv_tokens: int
    since: Seconds
    offloaded: bool = False


class AwaySessions:
    """The sessions away on a tool call, bounded (the oldest forgotten first)."""

    def __init__(self, pauses: ToolPauses | None = None, *, max_sessions: int = 10_000) -> None:
        self.pauses = pauses if pauses is not None else ToolPauses()
        self.max_sessions = max_sessions
        self._away: OrderedDict[SessionKey, Away] = OrderedDict()

    def __len__(self) -> int:
        return len(self._away)

    def left(self, key: SessionKey, worker: WorkerId, kv_tokens: int, now: Seconds) -> None:
        """``key``'s turn on ``worker`` ended in a tool call, holding ``kv_tokens`` of KV there."""
        away = self._away
        away.pop(key, None)
        away[key] = Away(worker, max(0, kv_tokens), now)
        while len(away) > self.max_sessions:
            away.popitem(last=False)

    def returned(self, key: SessionKey, now: Seconds) -> Away | None:
        """``key`` is back (its next request): off the book; its pause teaches the estimator."""
        away = self._away.pop(key, None)
        if away is not None:
            self.pauses.observe(now - away.since)
        return away

    def get(self, key: SessionKey) -> Away | None:
        """The booking of ``key``, if it is away."""
        return self._away.get(key)

    def expire(self, now: Seconds) -> None:
        """Forget sessions away past a few horizons: not coming back (their pause unknown)."""
        limit = 4.0 * self.pauses.horizon()
        away = self._away
        while away:
            key, first = next(iter(away.items()))
            if now - first.since <= limit:
                break
            away.pop(key)

    def reserved(self, now: Seconds) -> dict[WorkerId, int]:
        """Per worker, the KV tokens of sessions away for less than the horizon (on GPU)."""
        horizon = self.pauses.horizon()
        out: dict[WorkerId, int] = {}
        for away in self._away.values():
            if not away.offloaded and now - away.since < horizon:
                out[away.worker] = out.get(away.worker, 0) + away.kv_tokens
        return out

    def offload_due(
        self, worker: WorkerId, usage: float | None, threshold: float
    ) -> list[SessionKey]:
        """Sessions away on ``worker`` to offload now: its KV usage is at ``threshold`` or
        more. They are marked offloaded (asked once); most recently left last."""
        if usage is None or usage < threshold:
            return []
        due = [k for k, a in self._away.items() if a.worker == worker and not a.offloaded]
        for key in due:
            self._away[key].offloaded = True
        return due
