"""``run_bench``: one workload replayed live against one OpenAI-compatible target."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvgate.bench.client import BenchClient, normalize_target
from kvgate.bench.misses import live_misses
from kvgate.bench.payloads import PayloadBuilder
from kvgate.bench.replay import Replay
from kvgate.bench.report import results_document, summarize
from kvgate.workload.bound import Bound, capacity_reference, infinite_cache_bound
from kvgate.workload.prompts import CHARS_PER_TOKEN, PromptCodec
from kvgate.workload.request import SimRequest
from kvgate.workload.synthetic import Workload

DEFAULT_REQUESTS = 200
"""Requests taken from an endless synthetic workload when no count is given."""

Progress = Callable[[int, int], None]
"""``progress(done, total)`` after every answered request."""


def limited(workload: Workload, requests: int | None) -> Iterator[SimRequest]:
    """The workload's requests from the start, at most ``requests`` of them."""
    stream = workload.requests()
    return stream if requests is None else itertools.islice(stream, requests)


def workload_bound(workload: Workload, requests: int | None, block_size: int = 16) -> Bound:
    """The infinite-cache bound of the requests a run will send (the sim's own code)."""
    return infinite_cache_bound(limited(workload, requests), PromptCodec(block_size))


def workload_reference(
    workload: Workload, requests: int | None, fleet_kv_blocks: int, block_size: int = 16
) -> Bound:
    """The capacity-aware reference of the requests a run will send: the fleet's
    ``fleet_kv_blocks`` KV blocks (of ``block_size`` tokens) used as one LRU cache."""
    return capacity_reference(limited(workload, requests), PromptCodec(block_size), fleet_kv_blocks)


async def run_bench(
    target: str,
    workload: Workload,
    *,
    requests: int | None = DEFAULT_REQUESTS,
    concurrency: int = 64,
    model: str | None = None,
    time_scale: float = 1.0,
    label: str = "live",
    workers: Sequence[str] = (),
    block_size: int = 16,
    chars_per_token: int = CHARS_PER_TOKEN,
    session_header: str = "X-Session-ID",
    api_key: str | None = None,
    timeout_s: float = 600.0,
    progress: Progress | None = None,
    fleet_kv_blocks: int | None = None,
    ttft_floor: Callable[[int, int], float] | None = None,
    misses: bool = False,
    count_unanswered: bool = False,
) -> dict[str, Any]:
    """Replay ``workload`` against ``target`` and return a ``results.json`` document.

    The document has the shape of ``kvgate sim``'s: ``bound_hit_rate`` and one
    entry under ``"policies"`` named ``label``. ``requests`` caps the workload
    (None: all of a trace). ``model`` defaults to the first one the target lists.
    ``time_scale`` is the target's model seconds per real second: arrivals are
    compressed by it and latencies reported in model seconds (1 for a real
    fleet). ``block_size`` is the engine block size the infinite-cache bound
    assumes. ``workers`` names the fleet's workers (``X-Kvgate-Worker``
    values) so idle ones count in the load spread. ``fleet_kv_blocks``, the
    fleet's total KV blocks of ``block_size`` tokens, adds the capacity-aware
    reference beside the bound. ``ttft_floor`` (an emulated fleet's
    ``Engine.alone_ttft``) adds the TTFT floor's p99 (``bench.report.summarize``).
    ``misses`` adds the summary's ``misses``: the cache misses by cause, as ``kvgate sim
    --misses`` gives them (``bench.misses``; needs answers that name their worker, by
    the worker's ``kvgate_timing.worker`` or the gateway's ``X-Kvgate-Worker`` header).
    ``count_unanswered`` adds the judge's figures over every request (``summarize``).
    """
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    base = normalize_target(target)
    bound = workload_bound(workload, requests, block_size)
    reference = (
        workload_reference(workload, requests, fleet_kv_blocks, block_size)
        if fleet_kv_blocks
        else None
    )
    async with BenchClient(
        base, concurrency=concurrency, timeout_s=timeout_s, api_key=api_key
    ) as client:
        name = model or await client.first_model()
        builder = PayloadBuilder(
            name, chars_per_token=chars_per_token, session_header=session_header
        )
        total = bound.requests
        replay = Replay(
            client,
            builder,
            time_scale=time_scale,
            progress=(lambda done: progress(done, total)) if progress is not None else None,
        )
        sent: list[SimRequest] = []
        outcomes = await replay.run(_kept(limited(workload, requests), sent))
    summary = summarize(
        outcomes,
        time_scale=time_scale,
        bound=bound,
        workers=workers,
        reference=reference,
        ttft_floor=ttft_floor,
        count_unanswered=count_unanswered,
    )
    if misses:
        split = live_misses(sent, outcomes, block_size)
        if split is not None:
            summary["misses"] = split
    config = {
        "target": base,
        "model": name,
        "requests": requests,
        "concurrency": concurrency,
        "time_scale": time_scale,
        "block_size": block_size,
        "chars_per_token": chars_per_token,
        "fleet_kv_blocks": fleet_kv_blocks,
    }
    return results_document(
        {label: summary},
        workload=workload.describe(),
        bound=bound,
        config=config,
        reference=reference,
    )


def _kept(requests: Iterator[SimRequest], into: list[SimRequest]) -> Iterator[SimRequest]:
    """``requests``, each also appended to ``into`` as it is taken."""
    for request in requests:
        into.append(request)
        yield request
