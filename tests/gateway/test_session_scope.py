"""Session ids are the client's to choose: two clients with the same id stay apart."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from kvgate.gateway.testing import running_gateway
from kvgate.store import MemoryStore
from kvgate.testing import wait_until

from .conftest import every_worker_up, gateway_config, worker_fleet

KEYS = ("sk-alice-0123456789", "sk-bob-9876543210")


async def test_two_clients_sending_one_session_id_get_independent_affinities(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    store = MemoryStore()
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        worker_fleet(2) as (a, b),
        running_gateway(gateway_config([a, b], api_keys=list(KEYS)), store=store) as gw,
        aiohttp.ClientSession() as session,
    ):
        await wait_until(gw.gateway.ready, message="gateway ready")
        await every_worker_up(gw)
        for api_key in KEYS:
            headers = {"X-Session-ID": "shared", "Authorization": f"Bearer {api_key}"}
            url = gw.openai_base + "/chat/completions"
            async with session.post(url, json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
        async with session.get(
            gw.url + "/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}
        ) as resp:
            metrics = await resp.text()
        bound = [s for w in (a.url, b.url) for s in await store.sessions_of(w)]
    keys = {affinity.session_key for affinity in bound}
    assert len(keys) == 2, keys  # one binding each, not one shared
    assert await store.get("shared") is None
    for api_key in KEYS:
        assert all(api_key not in k for k in keys)
        assert api_key not in metrics
        assert api_key not in caplog.text
