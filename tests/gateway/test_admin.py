"""The admin API: bearer token, OpenAI-shaped errors, and run-time changes without restarts."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from kvgate.gateway.admin.routes import ADMIN_KEY, check_admin
from kvgate.gateway.config import ConfigError, parse_config
from kvgate.gateway.dataplane.errors import GatewayError, UnauthorizedError
from kvgate.gateway.testing import running_gateway
from kvgate.testing import wait_until
from kvgate.workersim import WorkerOptions, running_worker

from .conftest import set_faults
from .rollout_fleet import FAST, admin, spec, versioned_fleet

ROLLOUT = "demo/v2"


def test_admin_on_a_public_address_needs_a_token() -> None:
    with pytest.raises(ConfigError, match="admin_token"):
        parse_config({"listen": {"host": "0.0.0.0"}})
    assert parse_config({"listen": {"host": "0.0.0.0"}, "admin_token": "t"}).admin_token == "t"
    assert not parse_config(
        {"listen": {"host": "0.0.0.0"}, "admin": {"enabled": False}}
    ).admin.enabled
    assert parse_config({"listen": {"host": "::1"}}).admin.enabled


async def test_admin_routes_need_the_bearer_token() -> None:
    async with (
        versioned_fleet() as fleet,
        running_gateway(fleet.config()) as gw,
        aiohttp.ClientSession() as session,
    ):
        for token in (None, "wrong"):
            status, body = await admin(session, "GET", gw.url + "/admin/models", token=token)
            assert status == 401
            assert body["error"]["code"] == "invalid_admin_token"
        status, body = await admin(session, "GET", gw.url + "/admin/models")
        assert status == 200
        assert body["models"]["demo"]["weights"] == {"v1": 100.0, "v2": 0.0}
        assert set(body["models"]["demo"]["workers"]) == {"v1", "v2"}


async def test_admin_disabled_has_no_routes() -> None:
    async with (
        versioned_fleet() as fleet,
        running_gateway(fleet.config(admin={"enabled": False})) as gw,
        aiohttp.ClientSession() as session,
    ):
        status, body = await admin(session, "GET", gw.url + "/admin/rollouts")
        assert status == 404
        assert body["error"]["type"] == "invalid_request_error"
        # The drain routes are part of the admin API: off with it.
        for method, path in (("POST", "/admin/workers/0/drain"), ("GET", "/admin/pressure")):
            status, body = await admin(session, method, gw.url + path)
            assert status == 404, path


async def test_bad_specs_unknown_things_and_invalid_transitions() -> None:
    async with (
        versioned_fleet() as fleet,
        running_gateway(fleet.config()) as gw,
        aiohttp.ClientSession() as session,
    ):
        url = gw.url + "/admin/rollouts"
        cases = [
            (spec(gates={"max_error_rate": 2}), 400, "gates.max_error_rate"),
            (spec(steps=[50, 10]), 400, "steps"),
            (spec(bogus=1), 400, "bogus"),
            (spec(canary="v1"), 400, "canary"),
            (spec(canary="v9"), 404, "canary"),
        ]
        for body, code, param in cases:
            status, err = await admin(session, "POST", url, body)
            assert (status, err["error"]["param"]) == (code, param), err
        status, err = await admin(session, "GET", url + "/demo/nope")
        assert (status, err["error"]["code"]) == (404, "rollout_not_found")

        assert (await admin(session, "POST", url, spec(min_step_duration_s=60)))[0] == 201
        status, err = await admin(session, "POST", url, spec(name="again"))
        assert (status, err["error"]["code"]) == (409, "invalid_transition")  # model is busy
        status, err = await admin(session, "POST", f"{url}/{ROLLOUT}/resume")
        assert status == 409
        assert "cannot resume" in err["error"]["message"]
        status, err = await admin(
            session, "PUT", gw.url + "/admin/models/demo/weights", {"weights": {"v2": 50}}
        )
        assert status == 409  # the rollout owns the weights

        assert (await admin(session, "POST", f"{url}/{ROLLOUT}/pause"))[1]["state"] == "paused"
        assert (await admin(session, "POST", f"{url}/{ROLLOUT}/resume"))[1][
            "state"
        ] == "progressing"
        assert (await admin(session, "POST", f"{url}/{ROLLOUT}/abort"))[1]["state"] == "aborted"
        status, err = await admin(session, "POST", f"{url}/{ROLLOUT}/promote")
        assert status == 409
        status, listed = await admin(session, "GET", url)
        assert [r["state"] for r in listed["rollouts"]] == ["aborted"]


async def test_weights_versions_and_pins_change_at_run_time() -> None:
    async with (
        versioned_fleet() as fleet,
        running_gateway(fleet.config()) as gw,
        aiohttp.ClientSession() as session,
    ):
        models = gw.url + "/admin/models/demo"
        status, err = await admin(session, "PUT", models + "/weights", {"weights": {"v7": 1}})
        assert (status, err["error"]["code"]) == (404, "model_version_not_found")
        status, err = await admin(session, "PUT", models + "/weights", {"weights": {"v1": -1}})
        assert (status, err["error"]["param"]) == (400, "weights.v1")
        status, body = await admin(
            session, "PUT", models + "/weights", {"weights": {"v1": 0, "v2": 1}}
        )
        assert status == 200, body
        request = {"model": "demo", "prompt": "hello", "max_tokens": 2}
        async with session.post(gw.url + "/v1/completions", json=request) as resp:
            assert resp.headers["X-Kvgate-Model-Version"] == "v2"
        async with session.post(
            gw.url + "/v1/completions", json=request, headers={"X-Model-Version": "v1"}
        ) as resp:
            assert resp.headers["X-Kvgate-Model-Version"] == "v1"  # a pin wins, even at weight 0
        status, err = await admin(session, "DELETE", models + "/versions/v2")
        assert (status, err["error"]["code"]) == (409, "conflict")  # v1 has no weight left
        status, body = await admin(session, "POST", models + "/stable", {"version": "v2"})
        assert (status, body["stable"]) == (200, "v2")
        status, body = await admin(session, "DELETE", models + "/versions/v1")
        assert (status, body["weights"]) == (200, {"v2": 1.0})
        async with session.post(
            gw.url + "/v1/completions", json=request, headers={"X-Model-Version": "v1"}
        ) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["code"] == "model_version_not_found"


async def test_workers_are_added_and_removed_without_dropping_requests() -> None:
    async with (
        versioned_fleet() as fleet,
        running_worker(WorkerOptions(port=0, seed=9, version="v3", **FAST)) as extra,
        running_gateway(fleet.config()) as gw,
        aiohttp.ClientSession() as session,
    ):
        workers = gw.url + "/admin/workers"
        status, added = await admin(
            session, "POST", workers, {"url": extra.url, "model": "demo", "version": "v3"}
        )
        assert (status, added["up"]) == (201, True)
        assert (await admin(session, "POST", workers, {"url": extra.url}))[0] == 409
        assert (await admin(session, "POST", workers, {"url": "ftp://x"}))[1]["error"][
            "param"
        ] == "url"
        status, body = await admin(
            session, "POST", gw.url + "/admin/models/demo/versions", {"version": "v3"}
        )
        assert (status, body["weights"]["v3"]) == (201, 0.0)
        pin = {"X-Model-Version": "v3"}
        request = {"model": "demo", "prompt": "hello", "max_tokens": 2}
        async with session.post(gw.url + "/v1/completions", json=request, headers=pin) as resp:
            assert resp.status == 200
            assert resp.headers["X-Kvgate-Worker"] == extra.url

        # A slow request is in flight on the v3 worker when it is removed: it finishes.
        await set_faults(extra, extra_latency_ms=300.0)
        slow = asyncio.create_task(
            session.post(gw.url + "/v1/completions", json=request, headers=pin)
        )
        worker = gw.gateway.pool.get(extra.url)
        assert worker is not None
        await wait_until(lambda: worker.in_flight == 1, message="request in flight")
        status, removed = await admin(session, "DELETE", f"{workers}?url={extra.url}")
        assert (status, removed["in_flight"]) == (200, 1)
        async with session.post(gw.url + "/v1/completions", json=request, headers=pin) as resp:
            assert resp.status == 503  # no new request goes to it
        async with await slow as resp:
            assert resp.status == 200
            assert resp.headers["X-Kvgate-Worker"] == extra.url
        status, listed = await admin(session, "GET", workers)
        assert extra.url not in {w["url"] for w in listed["workers"]}
        status, err = await admin(session, "DELETE", f"{workers}?url={extra.url}")
        assert (status, err["error"]["code"]) == (404, "worker_not_found")


def test_one_guard_for_every_admin_route_token_or_loopback() -> None:
    """Without a token only loopback clients get in; with one, only its bearer."""

    class Peer:
        def __init__(self, host: str) -> None:
            self.host = host

        def get_extra_info(self, name: str, default: object = None) -> object:
            return (self.host, 5555) if name == "peername" else default

    def request(host: str, token: str | None, headers: dict[str, str]) -> web.Request:
        app = web.Application()
        control = SimpleNamespace(admin_token=token)
        app[ADMIN_KEY] = control  # type: ignore[assignment]
        return make_mocked_request("GET", "/admin/models", headers, app=app, transport=Peer(host))

    assert check_admin(request("127.0.0.1", None, {})) is not None
    with pytest.raises(GatewayError) as refused:
        check_admin(request("10.1.2.3", None, {}))
    assert refused.value.status == 403
    with pytest.raises(UnauthorizedError):
        check_admin(request("127.0.0.1", "t0k", {}))
    with pytest.raises(UnauthorizedError):
        check_admin(request("10.1.2.3", "t0k", {"Authorization": "Bearer nope"}))
    assert check_admin(request("10.1.2.3", "t0k", {"Authorization": "Bearer t0k"})) is not None


async def test_without_a_token_only_this_machines_own_clients_get_in() -> None:
    """The token-less admin API trusted any loopback peer: a page of any site in a browser
    on the machine POSTed a worker of its own (``text/plain``, no preflight, no answer
    needed: every prompt for the model could go to it), a name rebound to 127.0.0.1 read
    it all, and a proxy on the machine relayed the world to it. Now such requests are 403;
    the CLI's and a same-origin page's are not."""
    async with (
        versioned_fleet() as fleet,
        running_gateway(fleet.config(admin_token=None)) as gw,
        aiohttp.ClientSession() as session,
    ):
        authority = gw.url.removeprefix("http://")
        evil = '{"url": "http://127.0.0.1:9", "model": "demo"}'
        hostile = [
            ("POST", {"Origin": "https://evil.example", "Content-Type": "text/plain"}),
            ("POST", {"Origin": "null", "Content-Type": "text/plain"}),
            ("POST", {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}),
            ("POST", {"Origin": "http://localhost:3000", "Sec-Fetch-Site": "same-site"}),
            ("GET", {"Host": f"rebound.evil.example:{authority.rsplit(':', 1)[1]}"}),
            ("GET", {"X-Forwarded-For": "203.0.113.9"}),
            ("GET", {"Via": "1.1 nginx"}),
        ]
        for method, headers in hostile:
            async with session.request(
                method, gw.url + "/admin/workers", data=evil, headers=headers
            ) as resp:
                assert resp.status == 403, (headers, await resp.text())
        assert "127.0.0.1:9" not in {w.config.url for w in gw.gateway.pool}
        async with session.get(
            gw.url + "/dashboard/state.json", headers={"Origin": "https://evil.example"}
        ) as resp:
            assert resp.status == 403
        for headers in ({}, {"Origin": gw.url, "Sec-Fetch-Site": "same-origin"}):
            async with session.get(gw.url + "/admin/workers", headers=headers) as resp:
                assert resp.status == 200, headers
        async with session.get(
            f"http://localhost:{authority.rsplit(':', 1)[1]}/admin/models"
        ) as resp:
            assert resp.status == 200
