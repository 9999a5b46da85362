"""A small fake of the Kubernetes API server: one InferencePool, pods, a pod watch.

Enough of the API for ``control.kube``: GET of the pool, a pod list filtered by
label selector with a ``resourceVersion``, and a watch streaming the events a
test pushes (one JSON object a line), which a test may end or answer 410 Gone.
It checks the bearer token on every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TOKEN = "sa-token"


def pod(
    name: str, ip: str, *, ready: bool = True, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod as the API returns it."""
    return {
        "metadata": {"name": name, "labels": labels or {"app": "vllm"}, "resourceVersion": "1"},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


@dataclass
class FakeKube:
    """The fake API's state: the pool, the pods, and what each watch will stream."""

    port: int
    namespace: str = "inference"
    pool_name: str = "vllm"
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    gone_once: bool = False
    calls: list[str] = field(default_factory=list)
    version: int = 100
    url: str = ""

    def pool(self) -> dict[str, Any]:
        return {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": self.pool_name, "namespace": self.namespace},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm"}},
                "targetPorts": [{"number": self.port}],
                "endpointPickerRef": {"name": "kvgate-epp", "port": {"number": 9002}},
            },
        }

    def push(self, kind: str, item: dict[str, Any]) -> None:
        """Change a pod and tell the open watch."""
        self.version += 1
        item["metadata"]["resourceVersion"] = str(self.version)
        if kind == "DELETED":
            self.pods.pop(item["metadata"]["name"], None)
        else:
            self.pods[item["metadata"]["name"]] = item
        self.events.put_nowait({"type": kind, "object": item})

    def end_watch(self) -> None:
        self.events.put_nowait(None)

    def _authorized(self, request: web.Request) -> None:
        self.calls.append(f"{request.method} {request.path_qs}")
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            raise web.HTTPUnauthorized()

    async def get_pool(self, request: web.Request) -> web.Response:
        self._authorized(request)
        if request.match_info["name"] != self.pool_name:
            raise web.HTTPNotFound()
        return web.json_response(self.pool())

    async def pods_handler(self, request: web.Request) -> web.StreamResponse:
        self._authorized(request)
        wanted = dict(p.split("=", 1) for p in request.query["labelSelector"].split(","))
        if request.query.get("watch") != "1":
            items = [
                p for p in self.pods.values() if wanted.items() <= p["metadata"]["labels"].items()
            ]
            return web.json_response(
                {
                    "kind": "PodList",
                    "metadata": {"resourceVersion": str(self.version)},
                    "items": items,
                }
            )
        if self.gone_once:
            self.gone_once = False
            raise web.HTTPGone()
        response = web.StreamResponse()
        await response.prepare(request)
        while True:
            event = await self.events.get()
            if event is None:
                break
            await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
        return response

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[FakeKube]:
        app = web.Application()
        base = f"/apis/inference.networking.k8s.io/v1/namespaces/{self.namespace}"
        app.router.add_get(base + "/inferencepools/{name}", self.get_pool)
        app.router.add_get(f"/api/v1/namespaces/{self.namespace}/pods", self.pods_handler)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield self
        finally:
            self.end_watch()
            await runner.cleanup()
