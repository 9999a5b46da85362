"""An engine of a few batch slots (llama.cpp): when a request's first token comes.

Such an engine is no queue. Each slot holds one request from its prefill to its last
token, with its own KV; the slots prefill side by side, one batch a step (llama.cpp's
``update_slots``: every slot's prompt tokens, up to ``n_batch``, in one ``llama_decode``),
and a request's first token comes only when the step holding its last prompt token ends.
A request sent while a step runs waits for it, and a prompt's last tokens go in a step of
their own (a context checkpoint, ``engine.slots.ServerLoop``), which takes the prompts sent
meanwhile. So a request's prefill is shared with the whole of what the others ahead of it
have left to prefill, however short its own part (not as many of their tokens as its own:
processor sharing, which booked a short uncached turn beside others' cold prompts at a
fraction of the work it waited for, and so fitted the engine several times too slow), and
with those sent while it prefills, up to the slots.

A request sent past the slots waits for one to free (llama.cpp's slot plane holds it, or
the engine queues it): the engine works through the prompts ahead, in the order sent, and
each gives its slot back once it has decoded; it takes the slot of the one that gives it
back first past those ahead of it, and from then shares the batch with what is left of
their prompts (not with all of them again: that counted their prefill twice, once in the
wait and once beside it). ``core.speed`` keeps the book this reads. Pure: times are
passed in.

The engine works through the prompts ahead as they came, from each one's send: one sent
3 s ago onto an idle engine is 3 s into its prefill (one past when it should be done is
counted whole again: the engine is slower than believed, by how much unknown). Counted
from now instead, a worker whose cold prompt was nearly done looked as busy as one whose
cold prompt had just begun, and a new session behind the same shared prefix went to the
later one (TTFT 4.2 s, where round robin's went to the earlier one's: 2.4 s;
real_engine.py --rate 0.4 --seed 1, the request that made default's p99 lose).

Each request ahead weighs at least as many tokens as this one's own: a short uncached turn
over a long cached context costs the engine far more than its new tokens (each attends to
the whole cached KV: ``engine.slots.PrefillFit``), so a worker whose slots hold many
cheap-looking restored turns is not cheap. Counted at their uncached tokens alone, such a
worker drew every new session (real llama.cpp, real_engine.py --rate 0.4 --seed 2: 28 of
32 requests on one worker, 24 of 32 at load 11 with TTFT p50 9.1 s against round robin's
3.8 s); at least this one's, 18/14.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvgate.types import Seconds


def shared_prefill(
    slots: int,
    first_at: Sequence[Seconds | None],
    tokens: Sequence[float],
    uncached: float,
    mean: float,
    *,
    sent_at: Sequence[Seconds],
    now: Seconds,
    prefill_s: float,
    decode_s: float,
    rate: float,
    after: int = -1,
) -> tuple[Seconds, float]:
    """The wait for a slot of a request with ``uncached`` tokens sent at ``now``, and the
    prefill tokens its own are shared with once it has one (its own included).

    ``first_at``/``tokens``/``sent_at``: the requests in flight there, in the order they
    were sent, when each had its first token (``None``: not yet), its uncached tokens and
    when it was sent (its prefill began then, or once those before it were done). ``mean``:
    a request's mean uncached tokens there; ``prefill_s``: seconds a token; ``decode_s``:
    the mean time a request decodes after its first token; ``rate``: requests sent there
    a second (later ones share this one's prefill while it lasts). ``after``: the index of
    one of them whose slot it waits for (llama.cpp's slot plane, for the prefix that one
    is computing; -1: none), at least until that one gives it back."""
    releases: list[float] = []  # seconds until each gives its slot back
    done = 0.0  # seconds of prefill of those not at their first token, up to each
    start = 0.0
    at = -math.inf  # when the engine is through the prompts so far (in order, from each send)
    for i, (first, size, sent) in enumerate(zip(first_at, tokens, sent_at, strict=True)):
        if first is not None:
            since = now - first
            release = decode_s - since if decode_s > since else 0.0
        else:  # not at its first token: at it once those before it are
            work = prefill_s * (size if size > uncached else uncached)
            end = (sent if sent > at else at) + work
            # Past when it should have been done, the engine is slower than believed and
            # what is left of it unknown: counted whole, from now.
            at = end if end > now else (now if now > at else at) + work
            done = at - now
            release = done + decode_s
        releases.append(release)
        if i == after:
            start = release
    ahead = len(releases) - slots  # those that give a slot back before it has one, less one
    if ahead >= 0:
        releases.sort()
        start = start if start > releases[ahead] else releases[ahead]
    left = done - start  # seconds of the others' prefill still to do when it starts
    shared = uncached + (left / prefill_s if left > 0.0 and prefill_s > 0.0 else 0.0)
    room = slots - 1 - sum(1 for r in releases if r - decode_s > start)  # slots prefilling
    if room > 0 and rate > 0.0 and not start:
        # Requests sent here while it prefills join its last step with their prompts (not
        # past the slots: sent after it, they wait behind it for one).
        later = rate * prefill_s * shared
        shared += (later if later < room else room) * mean
    return start, shared
