"""The in-flight KV estimate: request demand, projected level and the KV headroom gate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvgate.core.features import RequestFeatures
from kvgate.core.fleet import Pressure, WorkerState
from kvgate.core.prefix import build_features
from kvgate.core.pressure import (
    PressureConfig,
    kv_committed_tokens,
    kv_demand_tokens,
    kv_fits,
    kv_output_tokens,
    kv_started_tokens,
    projected_level,
    projected_usage,
)

CFG = PressureConfig()  # soft 0.85, hard 0.95, 4 chars a token, 256 output tokens by default
CAP = 1000


def worker(
    in_flight: int = 1, tokens: int = 0, kv: float | None = None, cap: int | None = CAP
) -> WorkerState:
    return WorkerState(
        id="w",
        model="m",
        in_flight=in_flight,
        kv_in_flight_tokens=tokens,
        kv_usage=kv,
        kv_capacity_tokens=cap,
    )


@pytest.mark.parametrize(
    ("chars", "max_tokens", "expected"),
    [
        (400, 100, 200),  # 100 prompt tokens + 100 output
        (401, 100, 201),  # a partial token counts
        (400, None, 356),  # no limit given: the default output
        (400, 100_000, 356),  # a declared limit is a bound, not committed KV
        (0, 1, 1),
    ],
)
def test_kv_demand_is_prompt_tokens_plus_expected_output(
    chars: int, max_tokens: int | None, expected: int
) -> None:
    request = RequestFeatures("r", "m", prompt_chars=chars, max_tokens=max_tokens)
    assert kv_demand_tokens(request, CFG) == expected


@pytest.mark.parametrize(
    ("shared_chars", "expected"),
    [
        (0, 200),
        (200, 150),  # the worker holds half the prompt: KV for the other half only
        (400, 100),  # all of it cached: the output's blocks only
        (10_000, 100),  # a match longer than the prompt is the prompt
        (-5, 200),
    ],
)
def test_kv_demand_counts_only_what_the_worker_does_not_hold(
    shared_chars: int, expected: int
) -> None:
    request = RequestFeatures("r", "m", prompt_chars=400, max_tokens=100)
    assert kv_demand_tokens(request, CFG, shared_chars) == expected


@pytest.mark.parametrize(
    ("state", "committed", "usage"),
    [
        (worker(tokens=300), 300.0, 0.3),
        (worker(tokens=300, kv=0.5), 500.0, 0.5),  # work not sent by us shows in the scrape
        (worker(tokens=700, kv=0.5), 700.0, 0.7),  # sent since the scrape, or still to decode
        (worker(tokens=700, cap=None), 0.0, None),  # unknown size: nothing to judge
        # Requests that ended since the scrape freed 300 of the 500 it read.
        (replace(worker(tokens=100, kv=0.5), kv_freed_tokens=300), 200.0, 0.2),
        (replace(worker(tokens=300, kv=0.5), kv_freed_tokens=300), 300.0, 0.3),
    ],
)
def test_committed_tokens_are_the_higher_of_estimate_and_scrape(
    state: WorkerState, committed: float, usage: float | None
) -> None:
    assert kv_committed_tokens(state) == committed
    assert projected_usage(state) == usage


@pytest.mark.parametrize(
    ("level", "tokens", "cap", "expected"),
    [
        (Pressure.NORMAL, 849, CAP, Pressure.NORMAL),
        (Pressure.NORMAL, 850, CAP, Pressure.SOFT),  # at the soft mark: no new sessions
        (Pressure.NORMAL, 999, CAP, Pressure.SOFT),  # never HARD on the estimate alone
        (Pressure.HARD, 0, CAP, Pressure.HARD),  # never lowers the scraped level
        (Pressure.NORMAL, 5000, None, Pressure.NORMAL),
    ],
)
def test_projected_level_raises_to_soft_only(
    level: Pressure, tokens: int, cap: int | None, expected: Pressure
) -> None:
    assert projected_level(level, worker(tokens=tokens, cap=cap), CFG) is expected


@pytest.mark.parametrize(
    ("state", "demand", "output", "config", "fits"),
    [
        # One request in flight, at its typical output (256): 800 tokens started.
        (worker(tokens=1056), 150, 0, CFG, True),  # 950 = the hard mark
        (worker(tokens=1056), 151, 0, CFG, False),
        # The request's own output still to grow is not waited for: room for its prompt.
        (worker(tokens=1056), 406, 256, CFG, True),
        (worker(tokens=1056), 407, 256, CFG, False),
        # Four in flight: 1,024 of the 1,800 committed is output still to grow.
        (worker(in_flight=4, tokens=1800), 150, 0, CFG, True),
        # Past the soft mark by the scrape, growth preempts now: all of it counts.
        (worker(in_flight=4, tokens=1800, kv=0.86), 150, 0, CFG, False),
        (worker(tokens=800, kv=0.86), 90, 80, CFG, True),  # 860 + 90 = the hard mark
        (worker(tokens=800, kv=0.86), 91, 80, CFG, False),
        (worker(tokens=100, kv=0.9), 100, 0, CFG, False),  # the scrape says it is fuller
        (worker(in_flight=0, tokens=0, kv=0.9), 5000, 0, CFG, True),  # alone it always runs
        (worker(tokens=800, cap=None), 10_000, 0, CFG, True),  # unknown size: no gate
        (worker(tokens=800), 1000, 0, PressureConfig(kv_gate=False), True),
    ],
)
def test_kv_fits_keeps_started_kv_under_the_hard_mark(
    state: WorkerState, demand: int, output: int, config: PressureConfig, fits: bool
) -> None:
    assert kv_fits(state, demand, config, output) is fits


@pytest.mark.parametrize(
    ("state", "started"),
    [
        (worker(tokens=1056), 800.0),
        (worker(in_flight=2, tokens=300), 0.0),  # never below nothing
        (worker(in_flight=2, tokens=300, kv=0.5), 500.0),  # the scrape holds grown output
        (worker(tokens=1056, cap=None), 0.0),
    ],
)
def test_started_tokens_leave_out_output_still_to_grow(state: WorkerState, started: float) -> None:
    assert kv_started_tokens(state, CFG) == started


@pytest.mark.parametrize(("max_tokens", "expected"), [(None, 256), (100, 100), (10_000, 256)])
def test_kv_output_tokens_is_the_typical_output_under_the_limit(
    max_tokens: int | None, expected: int
) -> None:
    request = RequestFeatures("r", "m", prompt_chars=400, max_tokens=max_tokens)
    assert kv_output_tokens(request, CFG) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"max_tokens": 300}, 300),
        ({"max_completion_tokens": 50, "max_tokens": 300}, 50),  # the newer name wins
        ({"max_tokens": 0}, None),
        ({"max_tokens": "300"}, None),  # not ours to reject: the worker answers it
        ({"max_tokens": True}, None),
        ({}, None),
    ],
)
def test_features_carry_the_output_limit(body: dict[str, object], expected: int | None) -> None:
    payload = {"model": "m", "prompt": "hello", **body}
    assert build_features(payload, {}, request_id="r").max_tokens == expected
