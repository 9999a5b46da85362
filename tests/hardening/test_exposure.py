"""What reaches clients: worker ids not addresses, /metrics behind a key, checked worker URLs."""

from __future__ import annotations

import aiohttp
import pytest

from kvgate.gateway.config import ConfigError, parse_config
from kvgate.gateway.testing import GatewayHandle

from .conftest import fake_fleet

pytestmark = pytest.mark.usefixtures("both_servers")

TOKEN = "admin-secret"


async def test_worker_header_names_an_id_not_an_internal_url() -> None:
    async with fake_fleet(1) as (gw, (fake,)), aiohttp.ClientSession() as session:
        body = {"model": "demo", "prompt": "x"}
        async with session.post(gw.openai_base + "/completions", json=body) as resp:
            assert resp.status == 200
            name = resp.headers["X-Kvgate-Worker"]
    assert name.startswith("w-")
    assert "127.0.0.1" not in name and str(fake.port) not in name


async def _worker_header(gw: GatewayHandle) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.openai_base + "/completions", json={"model": "demo", "prompt": "x"}) as r,
    ):
        return r.headers["X-Kvgate-Worker"]


async def test_a_configured_worker_name_or_url_is_used_when_asked() -> None:
    async with fake_fleet(1, worker={"name": "gpu-a"}) as (gw, _):
        assert await _worker_header(gw) == "gpu-a"
    async with fake_fleet(1, expose_worker_urls=True) as (gw, (fake,)):
        assert await _worker_header(gw) == fake.url


async def test_metrics_need_a_client_key_when_keys_are_required() -> None:
    async with fake_fleet(1, api_keys=["k1"]) as (gw, _), aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/metrics") as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["code"] == "invalid_api_key"
        headers = {"Authorization": "Bearer k1"}
        async with session.get(gw.url + "/metrics", headers=headers) as resp:
            assert resp.status == 200
            assert b"kvgate_requests_total" in await resp.read()


async def test_metrics_can_be_left_open_or_put_behind_the_admin_token() -> None:
    open_metrics = {"api_keys": ["k1"], "metrics_auth": "open"}
    async with (
        fake_fleet(1, **open_metrics) as (gw, _),
        aiohttp.ClientSession() as s,
        s.get(gw.url + "/metrics") as resp,
    ):
        assert resp.status == 200
    admin_metrics = {"admin_token": TOKEN, "metrics_auth": "admin_token"}
    async with fake_fleet(1, **admin_metrics) as (gw, _), aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/metrics") as resp:
            assert resp.status == 401
        async with s.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 200
    with pytest.raises(ConfigError, match="metrics_auth"):
        parse_config({"metrics_auth": "api_key"})


@pytest.mark.parametrize(
    "url",
    [
        "http://",
        "http://:80",
        "http://host:99999",
        "http://host:0",
        "http://h h:1",
        "http://h:1/?q=1",
    ],
)
async def test_admin_refuses_a_worker_url_that_is_no_url(url: str) -> None:
    async with fake_fleet(1, admin_token=TOKEN) as (gw, _), aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + "/admin/workers",
            json={"url": url},
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as resp:
            assert resp.status == 400, await resp.text()
            assert (await resp.json())["error"]["type"] == "invalid_request_error"
        assert len(list(gw.gateway.pool)) == 1


async def test_a_workers_redirect_and_its_hop_by_hop_headers_stay_behind() -> None:
    """A worker's redirect (Starlette's ``redirect_slashes``) named the worker's own
    address in ``Location``: a client learnt it, and followed it around the gateway. The
    headers the worker's ``Connection`` lists are hop-by-hop, and a worker's
    ``X-Kvgate-Worker`` passed for the gateway's."""
    async with fake_fleet(1) as (gw, (fake,)), aiohttp.ClientSession() as session:
        body = {"model": "demo", "prompt": "mode:redirect"}
        async with session.post(
            gw.openai_base + "/completions", json=body, allow_redirects=False
        ) as resp:
            assert resp.status == 307
            headers = resp.headers
    assert headers["Location"] == "/v1/completions?x=1"
    assert headers["Content-Location"] == "/v1/c"
    assert "X-Worker-Secret" not in headers
    assert headers.getall("X-Kvgate-Worker") == [headers["X-Kvgate-Worker"]] != ["spoofed"]
    own = headers.getall("X-Kvgate-Request-ID")  # the gateway's id, never the worker's
    assert own == [headers["X-Kvgate-Request-ID"]] != ["spoofed"]
    assert all(str(fake.port) not in value for value in headers.values()), headers
