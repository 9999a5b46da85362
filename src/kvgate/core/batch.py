"""An engine of a few batch slots (llama.cpp): when a request's first token comes.

Such an engine is no queue. Each slot holds one request from its prefill to its last
token, with its own KV; the slots prefill side by side, one batch a step (llama.cpp's
``update_slots``: every slot's prompt tokens, up to ``n_batch``, in one ``llama_decode``),
and a request's first token comes only when the step holding its last prompt token ends.
A request sent while a step runs waits for it, and a prompt's last tokens go in a step of
their own (a context checkpoint, ``engine.slots.ServerLoop``), which takes the prompts sent
meanwhile. So a request's prefill is shared with the whole of the others' prompts
prefilling beside it, however short its own part (not as many of their tokens as its own:
processor sharing, which booked a short uncached turn beside others' cold prompts at a
fraction of the work it waited for, and so fitted the engine several times too slow), and
with those sent while it prefills, up to the slots. A request sent past the slots waits for
one to free: the requests in them prefill, then decode, and give their slots back one by
one. ``core.speed`` keeps the book this reads. Pure: times are passed in.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.types import Seconds


def shared_prefill(
    slots: int,
    first_at: Sequence[Seconds | None],
    tokens: Sequence[float],
    uncached: float,
    mean: float,
    *,
    now: Seconds,
    prefill_s: float,
    decode_s: float,
    rate: float,
) -> tuple[Seconds, float]:
    """The wait for a slot of a request with ``uncached`` tokens sent at ``now``, and the
    prefill tokens its own are shared with once in one (its own included).

    ``first_at``/``tokens``: the requests in flight there, in the order they were sent,
    when each had its first token (``None``: not yet) and its uncached tokens. ``mean``:
    a request's mean uncached tokens there; ``prefill_s``: seconds a token; ``decode_s``:
    the mean time a request decodes after its first token; ``rate``: requests sent there
    a second (later ones share this one's prefill while it lasts)."""
    held: list[float] = []  # seconds until each decoding request gives its slot back
    waiting: list[float] = []  # uncached tokens of those not at their first token, in order
    for first, size in zip(first_at, tokens, strict=True):
        if first is not None:
            since = now - first
            held.append(decode_s - since if decode_s > since else 0.0)
        else:  # not at its first token (however late)
            waiting.append(size)
    free = slots - len(held) if len(held) < slots else 0
    wait = 0.0
    if len(waiting) >= free:
        # Past the slots: those prefilling end theirs and decode, those decoding end; this
        # request takes the slot of the (ahead past the free ones + 1)-th to give one back.
        beside = waiting[:free]
        busy = prefill_s * sum(beside)
        releases = sorted(held + [busy + decode_s] * len(beside))
        turns, k = divmod(len(waiting) - free, len(releases)) if releases else (0, 0)
        cycle = prefill_s * mean * slots + decode_s  # a slot's whole turn, each later round
        wait = (releases[k] if releases else 0.0) + turns * cycle
        sharers = waiting[-(slots - 1) :] if slots > 1 else []
    else:
        sharers = waiting
    # Not at their first token, they are in the batch: all of their tokens (what they have
    # left is the book's drain at a rate it may not know yet; their first token is sure).
    shared = uncached + sum(sharers)
    room = slots - 1 - len(sharers)
    if room > 0 and rate > 0.0:
        # Requests sent here while it prefills join its last step with their prompts.
        later = rate * prefill_s * shared
        shared += (later if later < room else room) * mean
    return wait, shared
