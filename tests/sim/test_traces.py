"""Trace loaders on the real files (first records): Mooncake and RAGPulse."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kvgate.workload.traces import (
    MOONCAKE_BLOCK_TOKENS,
    RAGPULSE_ORDER,
    MooncakeTrace,
    RagPulseTrace,
    open_trace,
    trace_window,
)

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
MOONCAKE = TRACES / "mooncake" / "synthetic_trace.jsonl"
RAGPULSE = TRACES / "ragpulse"

needs_traces = pytest.mark.skipif(not MOONCAKE.exists(), reason="shared traces not present")


def raw(path: Path, n: int) -> list[dict[str, object]]:
    lines = (line for line in path.open() if line.strip())
    return [json.loads(line) for line in itertools.islice(lines, n)]


@needs_traces
def test_mooncake_records_become_requests_block_for_block() -> None:
    trace = open_trace(MOONCAKE, rate_scale=2.0)
    assert isinstance(trace, MooncakeTrace)
    records = raw(MOONCAKE, 50)
    requests = list(itertools.islice(trace.requests(), 50))
    for record, request in zip(records, requests, strict=True):
        ids = record["hash_ids"]
        assert isinstance(ids, list)
        assert [seg_id for seg_id, _ in request.segments] == ids
        assert all(t == MOONCAKE_BLOCK_TOKENS for _, t in request.segments[:-1])
        assert request.prompt_tokens == record["input_length"]
        assert request.max_tokens == record["output_length"]
        assert request.arrival == pytest.approx(float(str(record["timestamp"])) / 1000 / 2.0)
        assert request.session_id is None


@needs_traces
def test_ragpulse_assembles_components_in_order_with_their_lengths() -> None:
    trace = open_trace(RAGPULSE, rate_scale=100.0)
    assert isinstance(trace, RagPulseTrace)
    lengths = trace.lengths()
    records = raw(RAGPULSE / "0_trace.jsonl", 40)
    earliest = 0.0  # the second of the file's two runs starts at timestamp 0
    replayed = {(r.session_id, r.arrival): r for r in trace.requests()}
    for record in records:
        at = (float(str(record["timestamp"])) - earliest) / 100
        request = replayed[(str(record["session_id"]), at)]
        parts = record["hash_ids"]
        assert isinstance(parts, dict)
        expected = [(i, lengths[i]) for key in RAGPULSE_ORDER for i in parts[key]]
        assert list(request.segments[: len(expected)]) == expected
        assert request.prompt_tokens == record["input_length"]


@needs_traces
def test_ragpulse_runs_are_merged_into_time_order() -> None:
    # The file holds two time-ordered runs; replay interleaves them.
    arrivals = [r.arrival for r in RagPulseTrace(RAGPULSE).requests()]
    assert len(arrivals) == 7106
    assert arrivals == sorted(arrivals)


def test_open_trace_rejects_what_is_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        open_trace(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="0_trace"):
        open_trace(tmp_path)
    small = tmp_path / "t.jsonl"
    small.write_text(
        '{"timestamp": 5, "input_length": 700, "output_length": 3, "hash_ids": [1, 2]}\n\n'
        '{"timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": [7]}\n'
    )
    requests = list(open_trace(small).requests())
    assert [r.prompt_tokens for r in requests] == [10, 700]  # out-of-order runs merged
    assert requests[1].segments == ((1, 512), (2, 188))


def test_a_trace_window_starts_where_the_seed_says_at_the_rate_asked(tmp_path: Path) -> None:
    # Gaps of 1 s, then one lull of 100 s: the median gap, not the mean, sets the pace.
    stamps = [*range(0, 30_000, 1_000), 130_000, *range(131_000, 170_000, 1_000)]
    lines = [
        json.dumps({"timestamp": t, "input_length": 600, "output_length": 2, "hash_ids": [n, 1]})
        for n, t in enumerate(stamps)
    ]
    (tmp_path / "mooncake").mkdir()
    (tmp_path / "mooncake" / "synthetic_trace.jsonl").write_text("\n".join(lines) + "\n")
    starts = set()
    for seed in range(6):
        window = trace_window("trace:mooncake:rate=4", seed, 50, folder=tmp_path)
        requests = list(window.requests())
        assert len(requests) == 50 and requests[0].arrival == 0.0
        gaps = sorted(b.arrival - a.arrival for a, b in itertools.pairwise(requests))
        assert gaps[len(gaps) // 2] == pytest.approx(0.25)
        assert [r.request_id for r in window.requests()] == [r.request_id for r in requests]
        starts.add(requests[0].request_id)
    assert len(starts) > 1  # seeds replay different parts of the trace
    whole = list(trace_window("trace:mooncake", 0, 500, folder=tmp_path).requests())
    # The lull is kept: 100 median gaps long.
    assert len(whole) == len(stamps) and whole[-1].arrival == pytest.approx(169 / 4)
    for bad in ("trace:nope", "trace:mooncake:speed=2", "trace:mooncake:rate=0"):
        with pytest.raises(ValueError):
            trace_window(bad, 0, 10, folder=tmp_path)
