"""Where a live run's cache misses went, by the simulator's causes (``workload.misses``).

A live replay knows, per answered request, the worker that served it (by the
worker's own report, ``kvgate_timing.worker``, which the emulated workers give
behind any router; else the gateway's ``X-Kvgate-Worker`` header) and the cached
tokens the worker reported; the workload knows each request's blocks and its
conversation. Fed to ``Misses`` in the order the client saw them (a request placed
when it was sent, done when its answer ended), they split the live misses as the
simulator splits its own: ``new``, ``shared``, ``turn_early``, ``turn_home``,
``turn_moved``.

Two things differ from the simulator's split. A live run cannot read a worker's
cache, so all of a moved turn's reuse counts as ``turn_moved`` (the move's upper
bound: its home may have evicted some of it already). And the blocks are the
workload codec's model of the worker's tokens, as the infinite-cache bound's are:
a chat template's few tokens per message shift the worker's own blocks a little.
Requests without a worker or a ``cached_tokens`` report (a refusal, a worker that
names itself nowhere behind a router that names no worker) are left out; ``split``
says how many were split.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvgate.bench.replay import Outcome
from kvgate.workload.misses import Misses
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.request import SimRequest


def live_misses(
    requests: Iterable[SimRequest], outcomes: Sequence[Outcome], block_size: int
) -> dict[str, Any] | None:
    """The misses of the answered requests by cause (``Misses.summary``, plus
    ``split``: how many requests it covers), or ``None`` when none names its worker."""
    codec = PromptCodec(block_size)
    by_id = {request.request_id: request for request in requests}
    events: list[tuple[float, int, Outcome, SimRequest]] = []
    for outcome in outcomes:
        answer, request = outcome.answer, by_id.get(outcome.request_id)
        worker = answer.served_by or answer.worker
        if request is None or not answer.ok or worker is None:
            continue
        if answer.cached_tokens is None:
            continue
        # At one instant an answer ends before another is sent (a later turn goes at
        # its previous turn's end), so ends sort first.
        events.append((answer.sent, 1, outcome, request))
        events.append((answer.finished, 0, outcome, request))
    if not events:
        return None
    misses = Misses(block_size)
    events.sort(key=lambda event: (event[0], event[1]))
    for _, sent, outcome, request in events:
        answer = outcome.answer
        if sent:
            chain, reply = codec.engine_blocks_with_reply(request.segments, request.reply)
            prompt = answer.prompt_tokens or request.prompt_tokens
            misses.placed(
                request.request_id,
                str(answer.served_by or answer.worker),
                prompt,
                chain,
                reply,
                conversation=request.conversation,
            )
        else:
            misses.finished(request.request_id, answer.cached_tokens or 0)
    summary = misses.summary()
    summary["split"] = len(events) // 2
    return summary
