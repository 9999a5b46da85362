"""Discovery of an ``InferencePool``'s pods: a Kubernetes list-and-watch over plain HTTP.

The Gateway API Inference Extension names the model servers of a pool by an
``InferencePool`` (``inference.networking.k8s.io/v1``): ``spec.selector.matchLabels``
picks the pods, ``spec.targetPorts[0].number`` is their port. ``PoolWatch`` reads
the pool, lists the pods it selects, then watches them from the list's
``resourceVersion``: a pod that is running, ready and has an IP is a worker
(``http://IP:PORT``), added through ``Membership`` (probed before it takes
traffic); one that stops being so, or is deleted, is drained. A watch that ends
(the API server closes it every few minutes) or is too old (410 Gone) starts
over with a fresh list; an API error changes nothing until the next list works,
so an API server hiccup never empties a fleet.

The API is reached with aiohttp and the pod's service-account token (read again
at every list, as tokens rotate) and CA: the ``kubernetes`` client would bring a
large dependency for two GETs. The pod that runs kvgate needs ``get`` on
``inferencepools`` and ``list``/``watch`` on ``pods`` in the pool's namespace
(``deploy/overlays/inference-pool``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.control.config import InferencePoolTarget
from kvgate.gateway.control.membership import Membership
from kvgate.gateway.dataplane.errors import GatewayError
from kvgate.tasks import cancel_and_wait

log = logging.getLogger("kvgate.gateway.control.kube")

POOL_GROUP = "inference.networking.k8s.io/v1"
_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(Exception):
    """The API server did not give a usable answer (not the same as "no pods")."""


class WatchExpired(KubeError):  # noqa: N818 (the API's own word: 410 Gone)
    """The watch's resourceVersion is too old: list again."""


def pod_url(pod: Mapping[str, Any], port: int) -> str | None:
    """``http://IP:PORT`` of a pod that can take traffic now (``None``: it cannot)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if meta.get("deletionTimestamp") or not ip or status.get("phase") != "Running":
        return None
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    if not ready:
        return None
    shown = f"[{ip}]" if ":" in ip else ip
    return f"http://{shown}:{port}"


class KubeApi:
    """GET and watch on the API server, with a bearer token and the cluster's CA."""

    def __init__(self, target: InferencePoolTarget) -> None:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        self.base = (target.api_server or f"https://{host}:{port}").rstrip("/")
        self.token_path = target.token_path
        self.ssl: ssl.SSLContext | bool = True
        if target.ca_path and Path(target.ca_path).exists():
            self.ssl = ssl.create_default_context(cafile=target.ca_path)
        self.timeout_s = target.timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token_path and Path(self.token_path).exists():
            token = Path(self.token_path).read_text(encoding="utf-8").strip()
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        """One object or list; ``KubeError`` on anything but 200 with JSON."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with self._client().get(
                self.base + path,
                params=params,
                headers=self._headers(),
                ssl=self.ssl,
                timeout=timeout,
            ) as resp:
                if resp.status != 200:
                    raise KubeError(f"GET {path}: {resp.status} {(await resp.text())[:200]}")
                found = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise KubeError(f"GET {path}: {type(exc).__name__}: {exc}") from None
        if not isinstance(found, dict):
            raise KubeError(f"GET {path}: not a JSON object")
        return found

    async def watch(self, path: str, params: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        """The watch events of ``path`` (one JSON object a line) until the server ends it."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s)
        query = {**params, "watch": "1", "allowWatchBookmarks": "true"}
        try:
            async with self._client().get(
                self.base + path,
                params=query,
                headers=self._headers(),
                ssl=self.ssl,
                timeout=timeout,
            ) as resp:
                if resp.status == 410:
                    raise WatchExpired(f"watch {path}: 410 Gone")
                if resp.status != 200:
                    raise KubeError(f"watch {path}: {resp.status}")
                async for line in resp.content:
                    if line.strip():
                        event = json.loads(line)
                        if isinstance(event, dict):
                            yield event
        except (aiohttp.ClientError, ValueError) as exc:
            raise KubeError(f"watch {path}: {type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def kv_event_endpoints(
    url: str, events: int | None, replay: int | None
) -> tuple[str | None, str | None]:
    """A found worker's ``kv_events`` and ``kv_events_replay`` endpoints: its host at the
    target's ports (none without an events port; IPv6 in brackets)."""
    host = URL(url).host or ""
    shown = f"[{host}]" if ":" in host else host
    return (
        f"tcp://{shown}:{events}" if events else None,
        f"tcp://{shown}:{replay}" if events and replay else None,
    )


class PoolWatch:
    """Keeps the pool's workers in step with the pods one ``InferencePool`` selects."""

    def __init__(
        self, target: InferencePoolTarget, membership: Membership, api: KubeApi | None = None
    ) -> None:
        self.target = target
        self.membership = membership
        self.api = api or KubeApi(target)
        self.namespace = target.namespace or _own_namespace()
        self.owned: set[str] = set()
        """The worker URLs this watch added."""
        self.pods: dict[str, str | None] = {}
        """Pod name -> its worker URL (``None``: selected, but cannot take traffic)."""
        self.port = 0
        self.lists = 0
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def _pool_path(self) -> str:
        return f"/apis/{POOL_GROUP}/namespaces/{self.namespace}/inferencepools/{self.target.name}"

    @property
    def _pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    async def list_once(self) -> tuple[str, str]:
        """Read the pool and list its pods; bring the workers in step. Returns the label
        selector and the list's resourceVersion (where a watch starts)."""
        pool = await self.api.get(self._pool_path)
        spec = pool.get("spec") or {}
        labels = (spec.get("selector") or {}).get("matchLabels") or {}
        ports = spec.get("targetPorts") or []
        if not labels or not ports:
            raise KubeError(f"InferencePool {self.target.name}: no selector or target port")
        self.port = int(ports[0]["number"])
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        found = await self.api.get(self._pods_path, {"labelSelector": selector})
        self.pods = {
            item["metadata"]["name"]: pod_url(item, self.port) for item in found.get("items") or ()
        }
        self.lists += 1
        await self.reconcile()
        return selector, str((found.get("metadata") or {}).get("resourceVersion", ""))

    def apply(self, event: Mapping[str, Any]) -> str | None:
        """One watch event into ``pods``; the resourceVersion it carries."""
        kind = event.get("type")
        pod = event.get("object") or {}
        meta = pod.get("metadata") or {}
        if kind == "ERROR":
            if pod.get("code") == 410:
                raise WatchExpired("watch event: 410 Gone")
            raise KubeError(f"watch event: {pod.get('message')}")
        name = meta.get("name")
        if kind in ("ADDED", "MODIFIED") and name:
            self.pods[name] = pod_url(pod, self.port)
        elif kind == "DELETED" and name:
            self.pods.pop(name, None)
        version = meta.get("resourceVersion")
        return str(version) if version else None

    async def reconcile(self) -> None:
        """Add the ready pods' workers, drain those of pods gone or not ready."""
        wanted = {url for url in self.pods.values() if url is not None}
        pool = self.membership.pool
        for url in sorted(self.owned - wanted):
            self.owned.discard(url)
            with contextlib.suppress(GatewayError):  # already removed by the admin API
                await self.membership.remove(url)
            log.info("inference pool %s: worker %s left; draining it", self.target.name, url)
        for url in sorted(wanted - self.owned):
            if pool.get(url) is not None:
                continue  # a static or admin-added worker: not ours to manage
            try:
                await self.membership.add(self._worker(url))
            except GatewayError as exc:
                log.warning("inference pool %s: cannot add %s: %s", self.target.name, url, exc)
                continue
            self.owned.add(url)
            log.info("inference pool %s: worker %s joined", self.target.name, url)

    def _worker(self, url: str) -> WorkerConfig:
        t = self.target
        events, replay = kv_event_endpoints(url, t.kv_events_port, t.kv_events_replay_port)
        return WorkerConfig(
            url=url,
            model=t.model,
            version=t.version,
            api_key=t.api_key,
            labels={**t.labels, "inference_pool": t.name},
            max_in_flight=t.max_in_flight,
            kv_events=events,
            kv_events_replay=replay,
        )

    async def run(self) -> None:
        """List, watch until the watch ends, and again; errors wait ``retry_s``."""
        while True:
            try:
                selector, version = await self.list_once()
                params = {"labelSelector": selector, "resourceVersion": version}
                async for event in self.api.watch(self._pods_path, params):
                    found = self.apply(event)
                    if found:
                        params["resourceVersion"] = found
                    if event.get("type") != "BOOKMARK":
                        await self.reconcile()
                continue  # the server ended the watch: list again
            except WatchExpired:
                continue
            except KubeError as exc:
                self.failures += 1
                log.warning("inference pool %s: %s; keeping its workers", self.target.name, exc)
            except Exception:  # a bug here must not stop discovery for good
                self.failures += 1
                log.exception("inference pool %s: discovery round failed", self.target.name)
            await asyncio.sleep(self.target.retry_s)

    def start(self) -> None:
        """Run in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"kvgate-pool-{self.target.name}")

    async def stop(self) -> None:
        """Stop watching (the workers found stay in the pool until it closes)."""
        await cancel_and_wait(self._task)
        self._task = None
        await self.api.close()


def _own_namespace() -> str:
    path = _SA_DIR / "namespace"
    return path.read_text(encoding="utf-8").strip() if path.exists() else "default"
