"""A stalled stream shows in the metrics (issue 45, item 16).

``kvgate_inter_token_latency_seconds`` records one mean per stream: a 300 ms stall
among quick chunks averages away. ``kvgate_inter_token_latency_max_seconds``
records each stream's longest gap between chunks, on both relay paths (the
task's loop on aiohttp's server; the protocol-callback pump on the llhttp one,
whose first gap runs from a chunk the loop relayed).
"""

from __future__ import annotations

import aiohttp
import pytest

from .conftest import fake_fleet
from .fake_worker import STALL_S

pytestmark = pytest.mark.usefixtures("both_servers")


async def test_a_stall_shows_in_the_longest_gap_while_the_mean_hides_it() -> None:
    async with fake_fleet(1) as (gw, _), aiohttp.ClientSession() as session:
        body = {"model": "demo", "prompt": "mode:stall_stream", "stream": True}
        async with session.post(gw.openai_base + "/completions", json=body) as resp:
            assert resp.status == 200
            text = await resp.text()
        registry = gw.gateway.metrics.registry
    assert text.count("data: ") == 4  # three events and [DONE] (the usage asked for is kept)

    def one(name: str) -> list[tuple[float, float]]:
        """The histogram's (bound, cumulative count) pairs, over its one series."""
        return sorted(
            (float(s.labels["le"]), s.value)
            for f in registry.collect()
            for s in f.samples
            if s.name == name + "_bucket"
        )

    longest = one("kvgate_inter_token_latency_max_seconds")
    assert longest[-1][1] == 1  # one stream, one observation
    # The stall is there: nothing under it, the one stream at or above it.
    below = max(count for bound, count in longest if bound < STALL_S * 0.9)
    assert below == 0, longest
    labels = {"model": "demo", "version": "default", "worker": next(iter(gw.gateway.pool)).id}
    total = registry.get_sample_value("kvgate_inter_token_latency_max_seconds_sum", labels)
    assert total is not None and STALL_S * 0.9 <= total < STALL_S + 1.0
    # The mean over the stream's five tokens spreads the stall thin.
    mean = registry.get_sample_value("kvgate_inter_token_latency_seconds_sum", labels)
    assert mean is not None and mean < total / 2
