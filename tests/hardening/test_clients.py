"""What third-party clients of vLLM expect of the gateway (issue 45, item 17).

guidellm probes ``GET /health`` before a run (vLLM and the emulated worker answer
it); a request two workers fail with the same 5xx gets an error that says only
what is known, not that the request is to blame (the workers' own faults look
the same from here).
"""

from __future__ import annotations

import aiohttp
import pytest

from .conftest import fake_fleet

pytestmark = pytest.mark.usefixtures("both_servers")


async def test_get_health_is_answered_by_the_gateway() -> None:
    async with fake_fleet() as (gw, _), aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/health") as resp:
            assert resp.status == 200
            assert (await resp.json())["status"] == "ready"
        gw.gateway.draining = True  # the gateway's own answer (the workers are up)
        async with session.get(gw.url + "/health") as resp:
            assert resp.status == 503
        gw.gateway.draining = False


async def test_the_same_5xx_from_two_workers_blames_no_one() -> None:
    async with fake_fleet() as (gw, _), aiohttp.ClientSession() as session:
        body = {"model": "demo", "prompt": "mode:poison"}
        async with session.post(gw.openai_base + "/completions", json=body) as resp:
            assert resp.status == 502
            error = (await resp.json())["error"]
    assert (
        error["message"] == "2 workers each answered this request 500; it was not retried further"
    )
    assert "cause" not in error["message"]
