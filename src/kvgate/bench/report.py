"""What a live run measured, in the simulator's terms: summary, results.json, table.

Outcomes are fed to the simulator's ``RunRecorder`` so percentiles, hit rate
(cached tokens / prompt tokens, summed over answered requests), throughput and
load spread are computed by the same code as ``kvgate sim``; on request
(``count_unanswered``), hit rate and TTFTs over every request too, a refused or failed
one as a miss with an unbounded TTFT (what the judge compares). Times are reported
in *model* seconds: real seconds times ``time_scale`` (1 against a real fleet;
the emulated fleet's time scale against emulated workers).

The sim's queue and preemption figures cannot be seen from a client and are
left out; the client's own wait for a free connection slot is reported instead, and
how late it sent the requests behind the workload's arrivals (``send_late_p50``/``_p90``,
a session's wait for its previous turn included): a client that falls behind sends in
bursts, a workload burstier than the one replayed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.table import Table

from kvgate.bench.replay import Outcome
from kvgate.extras import require
from kvgate.tables import (
    DONE,
    LATENCIES,
    Column,
    count_column,
    csv_text,
    field,
    ms,
    percent,
    percent_column,
    ratio_column,
    rich_table,
)
from kvgate.workload.bound import Bound
from kvgate.workload.recorder import RunRecorder

UNNAMED_WORKER = "target"
"""Worker name for answers without an ``X-Kvgate-Worker`` header (a bare server)."""

INVALID = 400
"""The status of a request the worker itself rejects (longer than the model's context): the
fleet's workers are alike, so no router could have had it served; not held against one."""

_CLIENT_INVISIBLE = ("queue_mean", "queue_p99", "preemptions", "migrations")


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    np = require("numpy", "sim")  # not at import: the CLI loads this module for every command
    return round(float(np.percentile(values, q)), 6)


def summarize(
    outcomes: Sequence[Outcome],
    *,
    time_scale: float = 1.0,
    bound: Bound | None = None,
    workers: Sequence[str] = (),
    reference: Bound | None = None,
    ttft_floor: Callable[[int, int], float] | None = None,
    count_unanswered: bool = False,
) -> dict[str, Any]:
    """The run's figures, shaped as one policy's entry of ``kvgate sim``'s results.json.

    ``workers`` lists the fleet's worker ids when known, so a worker that served
    nothing still counts in the load spread. ``reference`` is the capacity-aware
    reference, when the fleet's KV size is known. ``ttft_floor``, when the fleet's
    engine model is known (an emulated fleet), is a request's TTFT alone on an idle
    worker from its prompt and cached tokens (``Engine.alone_ttft``); the summary's
    ``ttft_floor_p99`` is its p99, what no placement can cut at those cache hits.
    ``count_unanswered`` adds ``counting_unanswered``: hit rate and TTFTs over every
    request, one refused or failed a miss with a TTFT of +inf (the judge's figures; off
    by default, as +inf is no strict JSON).
    """
    seen = [o.answer.worker or UNNAMED_WORKER for o in outcomes if o.answer.ok]
    ids = list(dict.fromkeys([*workers, *sorted(set(seen))]))
    if not ids:
        ids = [UNNAMED_WORKER]
    index = {worker: i for i, worker in enumerate(ids)}
    recorder = RunRecorder(ids)
    errors: Counter[str] = Counter()
    missing_usage = 0
    waits: list[float] = []
    late: list[float] = []  # sent after the workload's arrival: the client fell behind
    worker_ttfts: list[float] = []
    worker_returns: list[float] = []
    for outcome in sorted(outcomes, key=lambda o: o.arrival):
        answer = outcome.answer
        recorder.arrived(outcome.arrival * time_scale)
        waits.append(max(0.0, answer.sent - outcome.due) * time_scale)
        late.append(max(0.0, answer.sent - outcome.arrival) * time_scale)
        if answer.reason:
            recorder.routed(answer.reason, migrated=False)
        if answer.status == 429:
            recorder.shed("429")
            recorder.unanswered_request(outcome.prompt_tokens, returning=outcome.returning)
            continue
        if not answer.ok:
            errors[_error_kind(answer.status, answer.error)] += 1
            if answer.status != INVALID:  # a failure, not the request's own fault
                recorder.unanswered_request(outcome.prompt_tokens, returning=outcome.returning)
            continue
        if answer.prompt_tokens is None:
            missing_usage += 1
        if answer.worker_ttft is not None:
            worker_ttfts.append(answer.worker_ttft)
            if outcome.returning:
                worker_returns.append(answer.worker_ttft)
        first = answer.first_token if answer.first_token is not None else answer.finished
        floor = None
        if ttft_floor is not None and answer.prompt_tokens is not None:
            floor = ttft_floor(answer.prompt_tokens, answer.cached_tokens or 0)
        recorder.finish(
            index[answer.worker or UNNAMED_WORKER],
            ttft=(first - answer.sent) * time_scale,
            e2e=(answer.finished - answer.sent) * time_scale,
            queued=0.0,
            prompt_tokens=answer.prompt_tokens or 0,
            cached_tokens=answer.cached_tokens or 0,
            output_tokens=answer.completion_tokens or 0,
            now=answer.finished * time_scale,
            ttft_floor=floor,
            returning=outcome.returning,
        )
    bound_rate = bound.hit_rate if bound is not None else None
    summary = recorder.summary(bound_rate)
    if reference is not None:
        summary["hit_rate_of_reference"] = (
            round(summary["hit_rate"] / reference.hit_rate, 6) if reference.hit_rate else None
        )
    for key in _CLIENT_INVISIBLE:
        summary.pop(key, None)
    summary.update(
        {
            "errors": sum(errors.values()),
            "error_kinds": dict(sorted(errors.items())),
            "missing_usage": missing_usage,
            "client_wait_mean": round(sum(waits) / len(waits), 6) if waits else 0.0,
            "client_wait_p99": _percentile(waits, 99),
            "send_late_p50": _percentile(late, 50),
            "send_late_p90": _percentile(late, 90),
            "time_scale": time_scale,
        }
    )
    if count_unanswered:
        summary["counting_unanswered"] = _counting_unanswered(
            recorder, worker_ttfts, worker_returns
        )
    if worker_ttfts:
        # The workers' own clocks: what routing changes, without the client's
        # and gateway's CPU contention (see workersim's ``kvgate_timing``).
        summary.update(
            {
                "worker_ttft_mean": round(sum(worker_ttfts) / len(worker_ttfts), 6),
                "worker_ttft_p50": _percentile(worker_ttfts, 50),
                "worker_ttft_p99": _percentile(worker_ttfts, 99),
            }
        )
    if worker_returns:
        # The turns back from a tool call, on the same clocks (agent shapes).
        summary.update(
            {
                "worker_ttft_return_p50": _percentile(worker_returns, 50),
                "worker_ttft_return_p99": _percentile(worker_returns, 99),
            }
        )
    return summary


def _counting_unanswered(
    recorder: RunRecorder, worker_ttfts: Sequence[float], worker_returns: Sequence[float]
) -> dict[str, Any]:
    """Every request counted, the unanswered as misses with a TTFT that never came, TTFTs on
    the workers' clocks (none where the answers carry no clock, none back from a tool call
    where there were no such turns)."""
    counted = recorder.counting_unanswered(worker_ttfts, worker_returns)
    if recorder.finished and not worker_ttfts:
        counted = {k: v for k, v in counted.items() if not k.startswith("ttft")}
    if not worker_returns and not recorder.unanswered_returns:
        counted = {k: v for k, v in counted.items() if not k.startswith("ttft_return")}
    return {"unanswered": recorder.unanswered, **counted}


def _error_kind(status: int, error: str | None) -> str:
    if status:
        return f"http_{status}"
    text = error or "unknown"
    return text.split(":", 1)[0].strip() or "unknown"


def results_document(
    runs: Mapping[str, dict[str, Any]],
    *,
    workload: dict[str, Any],
    bound: Bound,
    config: dict[str, Any],
    reference: Bound | None = None,
) -> dict[str, Any]:
    """``results.json``: the sim's shape, one entry per label (policy or target) under
    ``"policies"``, the infinite-cache bound and the capacity-aware reference (None
    when the fleet's KV size was not given) at the top level."""
    rate = round(bound.hit_rate, 6)
    return {
        "workload": workload,
        "config": config,
        "bound_hit_rate": rate,
        "bound": {
            "hit_rate": rate,
            "requests": bound.requests,
            "prompt_tokens": bound.prompt_tokens,
            "cached_tokens": bound.cached_tokens,
        },
        "reference_hit_rate": round(reference.hit_rate, 6) if reference is not None else None,
        "reference": _bound_json(reference) if reference is not None else None,
        "policies": dict(runs),
    }


def _bound_json(bound: Bound) -> dict[str, Any]:
    return {
        "hit_rate": round(bound.hit_rate, 6),
        "requests": bound.requests,
        "prompt_tokens": bound.prompt_tokens,
        "cached_tokens": bound.cached_tokens,
        "capacity_blocks": bound.capacity_blocks,
    }


BENCH_COLUMNS: tuple[Column, ...] = (
    DONE,
    ratio_column("req/s", "throughput"),
    percent_column("hit", "hit_rate", narrow=True),
    percent_column("/bound", "hit_rate_of_bound", narrow=True),
    *LATENCIES,
    ratio_column("max/mean", "load_max_over_mean"),
    ratio_column("CV", "load_cv"),
    count_column("errors", "errors", narrow=True),
    count_column("shed", "shed", narrow=True),
)
"""``kvgate bench``'s columns: what a client can measure; narrow ones fit 80 columns."""

_WORKER_TIMED: tuple[Column, ...] = (
    Column(
        "worker p50",
        "worker_ttft_p50",
        lambda s: ms(s.get("worker_ttft_p50")),
        field("worker_ttft_p50"),
        narrow=True,
    ),
    Column(
        "worker p99",
        "worker_ttft_p99",
        lambda s: ms(s.get("worker_ttft_p99")),
        field("worker_ttft_p99"),
    ),
)
"""Columns for workers that report their own TTFT (``kvgate_timing``)."""


_REFERENCE = Column(
    "/ref",
    "hit_rate_of_reference",
    lambda s: percent(s.get("hit_rate_of_reference")),
    field("hit_rate_of_reference"),
)
"""Hit rate against the fleet-KV LRU reference, when the results carry one (``--wide``)."""


def _columns(results: Mapping[str, Any]) -> tuple[Column, ...]:
    runs = results.get("policies", {})
    columns = BENCH_COLUMNS
    if results.get("reference_hit_rate") is not None:
        columns = (*columns[:4], _REFERENCE, *columns[4:])
    worker_timed = bool(runs) and all("worker_ttft_p50" in s for s in runs.values())
    return (*columns, *_WORKER_TIMED) if worker_timed else columns


def results_table(
    results: Mapping[str, Any], title: str | None = None, *, wide: bool = False
) -> Table:
    """One row per entry of ``results["policies"]``: the columns of ``kvgate sim``'s table
    that a client can measure, plus errors and sheds (``wide``: all of them)."""
    name = results.get("workload", {}).get("name", "workload")
    bound = float(results.get("bound_hit_rate", 0.0))
    reference = results.get("reference_hit_rate")
    heading = title or f"{name}: infinite-cache bound hit rate {bound:.1%}"
    if title is None and reference is not None:
        heading += f", fleet-KV LRU reference {float(reference):.1%}"
    runs = list(results.get("policies", {}).items())
    columns = _columns(results)
    caption = None
    if _WORKER_TIMED[0] in columns:
        caption = "worker p50: TTFT on the workers' own clock (model time)."
    if not wide:
        caption = f"{caption + ' ' if caption else ''}--wide: every column."
    return rich_table(heading, columns, runs, wide=wide, caption=caption)


def results_csv(results: Mapping[str, Any]) -> str:
    """Every column as a raw number (times in model seconds), one line per run."""
    return csv_text(_columns(results), list(results.get("policies", {}).items()))
