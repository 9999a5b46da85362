"""Helpers for version and rollout tests: a two-version fleet, steady traffic, admin calls."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from kvgate.testing import wait_until
from kvgate.workersim import WorkerOptions, running_worker
from kvgate.workersim.runner import WorkerHandle

FAST = {"profile": "fast", "time_scale": 50.0}
TOKEN = "s3cret"


@dataclass
class Fleet:
    """Baseline (v1) and canary (v2) workers of model ``demo``."""

    baseline: list[WorkerHandle]
    canary: list[WorkerHandle]

    def config(self, **overrides: Any) -> dict[str, Any]:
        """A gateway config splitting ``demo`` 100/0 between v1 and v2, with fast ticks."""
        workers = [{"url": w.url, "model": "demo", "version": "v1"} for w in self.baseline]
        workers += [{"url": w.url, "model": "demo", "version": "v2"} for w in self.canary]
        config: dict[str, Any] = {
            "workers": workers,
            "expose_worker_urls": True,  # answers are attributed to worker URLs
            "health": {"interval_s": 0.1, "timeout_s": 2.0},
            "retries": {"backoff_base_s": 0.0, "backoff_max_s": 0.0},
            # Per-worker outlier ejection would hide a failing canary from its own gates.
            "outlier": {"consecutive_failures": 1000},
            "models": {"demo": {"weights": {"v1": 100, "v2": 0}, "stable": "v1"}},
            "rollouts": {"tick_s": 0.05, "lease_ttl_s": 1.0, "bucket_s": 0.1},
            "admin_token": TOKEN,
        }
        config.update(overrides)
        return config


@contextlib.asynccontextmanager
async def versioned_fleet(
    baseline: int = 1,
    canary: int = 1,
    baseline_faults: dict[str, Any] | None = None,
    **canary_faults: Any,
) -> AsyncIterator[Fleet]:
    """Emulated workers: ``baseline`` of v1, ``canary`` of v2 (with ``canary_faults``)."""
    async with contextlib.AsyncExitStack() as stack:
        base, new = [], []
        for i in range(baseline + canary):
            is_canary = i >= baseline
            opts = WorkerOptions(
                port=0,
                seed=i,
                version="v2" if is_canary else "v1",
                **{**FAST, **(canary_faults if is_canary else baseline_faults or {})},
            )
            handle = await stack.enter_async_context(running_worker(opts))
            (new if is_canary else base).append(handle)
        yield Fleet(base, new)


def spec(**overrides: Any) -> dict[str, Any]:
    """A rollout of demo v1 -> v2 with short steps and small sample needs."""
    body: dict[str, Any] = {
        "model": "demo",
        "baseline": "v1",
        "canary": "v2",
        "steps": [10, 25, 50, 100],
        "min_step_duration_s": 0.3,
        "min_requests_per_step": 5,
        "analysis_window_s": 2.0,
        "interval_s": 0.05,
        "gates": {
            "min_samples": 5,
            "max_error_rate": 0.01,
            # No latency gates unless a test asks for them: wall-clock p99 of a few
            # samples through one shared event loop is their maximum, and one scheduling
            # hiccup on a busy machine broke even a 10x bound (observed 23.57x, a
            # restart test rolled back in about one run in six under two CPU hogs).
            "latency_p99": None,
            "ttft_p99": None,
        },
    }
    body.update(overrides)
    return body


@dataclass
class Traffic:
    """Closed-loop requests with distinct prompts (so no two share a session) until stopped."""

    url: str
    concurrency: int = 6
    headers: dict[str, str] = field(default_factory=dict)
    versions: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        while not self._stop.is_set():
            n = next(self._ids)
            body = {"model": "demo", "prompt": f"request {n}: say something", "max_tokens": 4}
            try:
                async with session.post(
                    self.url + "/v1/completions", json=body, headers=self.headers
                ) as resp:
                    await resp.read()
                    self.statuses[resp.status] += 1
                    self.versions[resp.headers.get("X-Kvgate-Model-Version", "")] += 1
            except aiohttp.ClientError:
                self.statuses[0] += 1

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Traffic]:
        """Send traffic for the block's duration."""
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(self._loop(session)) for _ in range(self.concurrency)]
            try:
                yield self
            finally:
                self._stop.set()
                await asyncio.gather(*tasks)


async def admin(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: object = None,
    token: str | None = TOKEN,
) -> tuple[int, Any]:
    """One admin call: (status, decoded JSON)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def rollout_state(session: aiohttp.ClientSession, base: str, rollout: str) -> dict[str, Any]:
    """The rollout's status from the admin API."""
    status, body = await admin(session, "GET", f"{base}/admin/rollouts/{rollout}")
    assert status == 200, body
    return dict(body)


async def wait_state(
    session: aiohttp.ClientSession, base: str, rollout: str, *states: str, within: float = 15
) -> dict[str, Any]:
    """Wait until the rollout is in one of ``states``; its status then."""
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        seen.update(await rollout_state(session, base, rollout))
        return seen["state"] in states

    await wait_until(reached, timeout=within, interval=0.05, message=f"rollout in {states}")
    return seen


@dataclass
class Receiver:
    """A small aiohttp app that records what is POSTed to it (webhooks, evaluator)."""

    received: list[dict[str, Any]] = field(default_factory=list)
    score: float = 1.0
    url: str = ""

    async def alert(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        return web.json_response({"ok": True})

    async def evaluate(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        return web.json_response({"score": self.score})

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Receiver]:
        """Listen on a free port for the block's duration."""
        app = web.Application()
        app.router.add_post("/alert", self.alert)
        app.router.add_post("/score", self.evaluate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield self
        finally:
            await runner.cleanup()
