"""Trace replay: Mooncake and RAGPulse request traces as streams of ``SimRequest``.

Traces are read line by line, never loaded whole. A first pass notes where each
run of non-decreasing timestamps starts (RAGPulse's file is two such runs); the
replay merges the runs, so requests come out in time order with memory bounded
by the number of runs.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import json
import random
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgate.workload.request import Segment, SimRequest

MOONCAKE_BLOCK_TOKENS = 512
"""Mooncake's ``hash_ids`` name one 512-token block each."""

RAGPULSE_ORDER = ("sys_prompt", "passages_ids", "history", "web_search", "user_input")
"""The order RAGPulse's components are assembled into one prompt (its README's)."""

_RAGPULSE_LENGTHS = (
    ("1_sys_prompt.jsonl", "sys_prompt_id"),
    ("2_passages.jsonl", "passage_id"),
    ("3_history.jsonl", "history_id"),
    ("4_user_input.jsonl", "user_input_id"),
    ("5_web_search.jsonl", "web_search_id"),
)


def _records(path: Path, start: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
    """JSON objects of a JSONL file between two byte offsets; blank lines skipped."""
    with path.open("rb") as handle:
        handle.seek(start)
        while stop is None or handle.tell() < stop:
            line = handle.readline()
            if not line:
                return
            if line.strip():
                record: dict[str, Any] = json.loads(line)
                yield record


def _runs(path: Path) -> tuple[list[tuple[int, int | None]], float]:
    """Byte ranges of the file's time-ordered runs, and its earliest timestamp."""
    starts: list[int] = []
    earliest = float("inf")
    previous = float("-inf")
    with path.open("rb") as handle:
        while True:
            offset = handle.tell()
            line = handle.readline()
            if not line:
                break
            if not line.strip():
                continue
            stamp = float(json.loads(line)["timestamp"])
            if not starts or stamp < previous:
                starts.append(offset)
            previous = stamp
            earliest = min(earliest, stamp)
    ends: list[int | None] = [*starts[1:], None]
    return list(zip(starts, ends, strict=True)), (0.0 if earliest == float("inf") else earliest)


def _merged(path: Path) -> Iterator[tuple[float, dict[str, Any]]]:
    """``(timestamp, record)`` over the whole file in time order."""
    ranges, _ = _runs(path)
    streams = [
        ((float(r["timestamp"]), r) for r in _records(path, start, stop)) for start, stop in ranges
    ]
    # Ties keep file order: heapq.merge prefers the earlier run on equal keys.
    yield from heapq.merge(*streams, key=lambda item: item[0])


@dataclass(frozen=True)
class MooncakeTrace:
    """A Mooncake FAST'25 trace (``timestamp`` ms, lengths, 512-token ``hash_ids``).

    ``rate_scale`` 2 replays twice as fast. The ids are used as segments; the
    simulator chains them, so two requests share a prefix as far as their leading
    ids agree.
    """

    path: Path
    rate_scale: float = 1.0
    name: str = "mooncake"

    def requests(self) -> Iterator[SimRequest]:
        """The trace's requests in time order."""
        for n, (stamp, record) in enumerate(_merged(self.path)):
            ids: list[int] = record.get("hash_ids") or []
            tokens = int(record["input_length"])
            segments: list[Segment] = []
            for i, block_id in enumerate(ids):
                left = tokens - i * MOONCAKE_BLOCK_TOKENS
                if left <= 0:
                    break
                segments.append((int(block_id), min(MOONCAKE_BLOCK_TOKENS, left)))
            covered = sum(t for _, t in segments)
            if covered < tokens:
                # Tokens beyond the listed blocks are this request's own: a negative
                # id cannot collide with the trace's ids.
                segments.append((-(n + 1), tokens - covered))
            yield SimRequest.of(
                stamp / 1000.0 / self.rate_scale,
                f"r{n}",
                tuple(segments),
                int(record.get("output_length", 1)),
            )

    def describe(self) -> dict[str, Any]:
        """Trace name, file and rate scale."""
        return {"name": self.name, "trace": str(self.path), "rate_scale": self.rate_scale}


@dataclass(frozen=True)
class RagPulseTrace:
    """The RAGPulse trace: per-component ids assembled in ``RAGPULSE_ORDER``.

    ``directory`` holds ``0_trace.jsonl`` (seconds, session ids) and the files
    that give each id's token length. Arrivals start at the earliest timestamp;
    ``rate_scale`` compresses the week-long trace (100 gives about 1.2 req/s).
    """

    directory: Path
    rate_scale: float = 1.0
    name: str = "ragpulse"
    _lengths: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def lengths(self) -> dict[int, int]:
        """Token length of every component id (loaded once; bounded by the vocabulary)."""
        if not self._lengths:
            for filename, key in _RAGPULSE_LENGTHS:
                for record in _records(self.directory / filename):
                    self._lengths[int(record[key])] = int(record["token_length"])
        return self._lengths

    def requests(self) -> Iterator[SimRequest]:
        """The trace's requests in time order."""
        lengths = self.lengths()
        trace = self.directory / "0_trace.jsonl"
        _, earliest = _runs(trace)
        for n, (stamp, record) in enumerate(_merged(trace)):
            parts = record.get("hash_ids") or {}
            segments: list[Segment] = [
                (int(i), lengths.get(int(i), 1))
                for key in RAGPULSE_ORDER
                for i in parts.get(key, ())
            ]
            covered = sum(t for _, t in segments)
            tokens = int(record.get("input_length", covered))
            if covered < tokens:
                # The chat template's tokens, which the trace counts but does not name.
                segments.append((-(n + 1), tokens - covered))
            session = record.get("session_id")
            yield SimRequest.of(
                (stamp - earliest) / self.rate_scale,
                f"r{n}",
                tuple(segments),
                int(record.get("output_length", 1)),
                session_id=str(session) if session else None,
                conversation=str(session) if session else None,
            )

    def describe(self) -> dict[str, Any]:
        """Trace name, folder and rate scale."""
        return {"name": self.name, "trace": str(self.directory), "rate_scale": self.rate_scale}


def open_trace(path: str | Path, rate_scale: float = 1.0) -> MooncakeTrace | RagPulseTrace:
    """The trace at ``path``: a RAGPulse folder (or its ``0_trace.jsonl``) or a Mooncake file."""
    path = Path(path)
    if rate_scale <= 0:
        raise ValueError("rate scale must be positive")
    if path.is_dir():
        if (path / "0_trace.jsonl").exists():
            return RagPulseTrace(path, rate_scale)
        raise ValueError(f"{path} is a folder without 0_trace.jsonl (RAGPulse)")
    if not path.exists():
        raise ValueError(f"trace {path} does not exist")
    first = next(_records(path), None)
    if first is not None and isinstance(first.get("hash_ids"), dict):
        return RagPulseTrace(path.parent, rate_scale)
    return MooncakeTrace(path, rate_scale)


TRACE_PREFIX = "trace:"
"""A workload spec naming a public trace instead of a generator: ``trace:NAME[:rate=R]``."""

TRACE_FILES = {"mooncake": "mooncake/synthetic_trace.jsonl", "ragpulse": "ragpulse"}
"""The public traces a spec may name, under the traces folder (``traces_folder``)."""


def traces_folder() -> Path:
    """Where the public traces lie: ``shared/traces`` beside the checkout or above it (a
    worktree), else above the working directory; a ``ValueError`` when neither holds one."""
    for base in (Path(__file__).resolve(), Path.cwd().resolve()):
        for parent in base.parents:
            if (parent / "shared" / "traces").is_dir():
                return parent / "shared" / "traces"
    raise ValueError("no shared/traces folder above the checkout or the working directory")


@dataclass(frozen=True)
class TraceWindow:
    """``count`` consecutive requests of a trace from a seeded start, replayed at ``rate``.

    A trace is one recording, so seeds would all replay the same requests: the seed picks
    where the window starts instead (uniformly over the trace). The window's arrivals are
    shifted to start at 0 and scaled so that its median gap is ``1 / rate``: its bursts and
    lulls kept in proportion (a mean would let one night's lull in RAGPulse, a hundred median
    gaps long, squeeze the day's traffic into a fraction of the window).
    """

    trace: MooncakeTrace | RagPulseTrace
    count: int
    seed: int
    rate: float

    @property
    def name(self) -> str:
        """The trace's name."""
        return self.trace.name

    @functools.cached_property
    def window(self) -> tuple[SimRequest, ...]:
        """The window's requests as the trace has them (read once: each router replays it)."""
        every = list(self.trace.requests())
        count = min(self.count, len(every))
        rng = random.Random(f"{self.trace.name}:{self.seed}:window")
        start = rng.randrange(len(every) - count + 1)
        return tuple(every[start : start + count])

    def requests(self) -> Iterator[SimRequest]:
        """The window's requests in time order, the first arriving at 0."""
        window = self.window
        gaps = [b.arrival - a.arrival for a, b in itertools.pairwise(window)]
        typical = statistics.median(gaps) if gaps else 0.0
        scale = 1.0 / self.rate / typical if typical > 0 else 1.0
        first = window[0].arrival
        for request in window:
            yield dataclasses.replace(request, arrival=(request.arrival - first) * scale)

    def describe(self) -> dict[str, Any]:
        """Trace, window and rate."""
        return {**self.trace.describe(), "window": self.count, "seed": self.seed, "rate": self.rate}


def trace_window(spec: str, seed: int, count: int, folder: Path | None = None) -> TraceWindow:
    """The ``seed``'s window of ``count`` requests of ``trace:NAME[:rate=R]`` (``TRACE_FILES``;
    its median gap 1/R seconds, R 4 by default); an unknown name or option is a ``ValueError``."""
    name, _, options = spec.removeprefix(TRACE_PREFIX).partition(":")
    if name not in TRACE_FILES:
        raise ValueError(f"unknown trace {name!r}; known: {', '.join(TRACE_FILES)}")
    rate = 4.0
    for item in filter(None, (part.strip() for part in options.split(","))):
        key, _, value = item.partition("=")
        if key.strip() != "rate":
            raise ValueError(f"a trace has one option, rate; got {item!r}")
        rate = float(value)
    if rate <= 0 or count < 1:
        raise ValueError("a trace window needs a positive rate and at least one request")
    trace = open_trace((folder or traces_folder()) / TRACE_FILES[name])
    return TraceWindow(trace, count, seed, rate)
