"""The upstream boundary translates the client library's errors into kvgate's own."""

from __future__ import annotations

import pytest

from kvgate.gateway.dataplane.errors import UpstreamTimeout, UpstreamUnavailable
from kvgate.gateway.upstream.transport import Timeouts, Upstream
from kvgate.testing import free_port
from kvgate.workersim.runner import WorkerHandle

from .conftest import set_faults


async def test_connection_refused_is_upstream_unavailable() -> None:
    upstream = Upstream(f"http://127.0.0.1:{free_port()}", Timeouts(0.5, 0.5, 1.0))
    try:
        with pytest.raises(UpstreamUnavailable) as info:
            await upstream.post("/v1/completions", b"{}", {})
        assert info.value.retryable
    finally:
        await upstream.close()


async def test_no_first_byte_in_time_is_upstream_timeout(workers: list[WorkerHandle]) -> None:
    await set_faults(workers[0], hang=True)
    upstream = Upstream(workers[0].url, Timeouts(0.5, 0.2, 5.0))
    try:
        with pytest.raises(UpstreamTimeout) as info:
            await upstream.post("/v1/completions", b'{"model": "demo", "prompt": "x"}', {})
        assert not info.value.retryable
    finally:
        await upstream.close()
