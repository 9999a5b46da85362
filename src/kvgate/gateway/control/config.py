"""Configuration of the gateway's control plane: model versions, rollouts, admin API.

These sections of ``kvgate.yaml`` sit beside the data-plane ones in
``gateway.config``. Example::

    models:
      llama-3-8b: {weights: {v2.1: 100, v3.0: 0}, stable: v2.1}
    rollouts:
      tick_s: 1.0
      alert_webhook: "https://alerts.example/kvgate"
      evaluator: {url: "http://127.0.0.1:9000/score", sample_rate: 0.05}
    admin: {enabled: true}
    admin_token: "..."   # required when listen.host is not a loopback address
"""

from __future__ import annotations

import ipaddress
import math
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelVersionsConfig(_Model):
    """One model's version weights (only ratios matter) and its stable version.

    ``stable`` defaults to the version with the largest weight (ties: first by name).
    A model with no entry here is not split by version: its requests may go to any
    of its workers, whatever version they serve, until weights are set for it.
    """

    weights: dict[str, float] = Field(min_length=1)
    stable: str | None = None

    @field_validator("weights")
    @classmethod
    def _valid_weights(cls, value: dict[str, float]) -> dict[str, float]:
        for name, weight in value.items():
            if not name.strip():
                raise ValueError("version names must be non-empty")
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(f"weight of {name!r} must be finite and >= 0")
        if sum(value.values()) <= 0:
            raise ValueError("weights must sum to more than 0")
        return value

    @model_validator(mode="after")
    def _known_stable(self) -> Self:
        if self.stable is not None and self.stable not in self.weights:
            raise ValueError(f"stable version {self.stable!r} has no weight")
        return self

    def stable_version(self) -> str:
        """The configured stable version, or the heaviest one."""
        if self.stable is not None:
            return self.stable
        return min(self.weights, key=lambda name: (-self.weights[name], name))


class EvaluatorConfig(_Model):
    """The quality evaluator: an HTTP endpoint or a Python entry point (exactly one).

    The endpoint is POSTed one sampled canary response (request and response
    text) and answers ``{"score": <float>}``; the entry point ``module:function``
    is called with the same mapping and returns the score (or an awaitable).
    Samples beyond ``max_pending`` waiting ones are dropped, never queued.
    """

    url: str | None = None
    entry_point: str | None = None
    sample_rate: float = Field(default=0.1, gt=0, le=1)
    timeout_s: float = Field(default=10.0, gt=0)
    max_pending: int = Field(default=64, ge=1)
    concurrency: int = Field(default=2, ge=1)

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.url is None) == (self.entry_point is None):
            raise ValueError("give exactly one of url and entry_point")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL, got {self.url!r}")
        if self.entry_point is not None and ":" not in self.entry_point:
            raise ValueError("entry_point must look like 'module:function'")
        return self


class RolloutsConfig(_Model):
    """How the rollout controller runs.

    ``tick_s``: how often the background loop runs (each rollout is judged every
    ``interval_s`` of its spec, on the next tick) and how often replicas poll
    the store for weights. ``lease_ttl_s``: how long the controller lease lasts
    without renewal (another replica takes over after it). ``bucket_s``: the
    outcome windows' resolution (capped at a tenth of a rollout's window).
    """

    enabled: bool = True
    tick_s: float = Field(default=1.0, gt=0)
    lease_ttl_s: float = Field(default=10.0, gt=0)
    bucket_s: float = Field(default=5.0, gt=0)
    alert_webhook: str | None = None
    alert_timeout_s: float = Field(default=5.0, gt=0)
    evaluator: EvaluatorConfig | None = None
    store_prefix: str = Field(default="kvgate", min_length=1)

    @field_validator("alert_webhook")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s) URL, got {value!r}")
        return value

    @model_validator(mode="after")
    def _lease_outlives_tick(self) -> Self:
        if self.lease_ttl_s <= self.tick_s:
            raise ValueError("lease_ttl_s must be longer than tick_s")
        return self


class AdminConfig(_Model):
    """The admin API (``/admin/...``): versions, weights, workers, rollouts.

    Every admin endpoint needs ``Authorization: Bearer <admin_token>`` when a
    token is set; without one the API is only allowed on a loopback address, to this
    machine's own clients: a request relayed by a proxy (``Forwarded``,
    ``X-Forwarded-For``, ``X-Real-IP``, ``Via``), from a browser page of another origin
    (``Origin``, ``Sec-Fetch-Site``) or naming a host that is not loopback (DNS
    rebinding) is a 403. Set a token behind a proxy on the same machine.
    """

    enabled: bool = True


def is_loopback(host: str) -> bool:
    """True when ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class DnsTarget(_Model):
    """One DNS name whose records are workers, and what every such worker serves.

    ``record: A`` (A and AAAA records, e.g. a Kubernetes headless Service) needs
    ``port``; ``record: SRV`` takes host and port from each SRV record (e.g.
    ``_http._tcp.vllm.default.svc.cluster.local``). The worker fields (``model``,
    ``version``, ``api_key``, ``labels``, ``max_in_flight``) apply to every
    worker found; ``model`` unset: learned from each worker's ``/v1/models``.
    """

    name: str = Field(min_length=1)
    record: Literal["A", "SRV"] = "A"
    port: int | None = Field(default=None, ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    model: str | None = None
    version: str | None = None
    api_key: str | None = Field(default=None, repr=False)
    labels: dict[str, str] = Field(default_factory=dict)
    max_in_flight: int | None = Field(default=None, ge=1)
    kv_events_port: int | None = Field(default=None, ge=1, le=65535)
    """Each worker found publishes KV events on its address at this port (vLLM's and
    SGLang's ``--kv-events-config`` endpoint, e.g. 5557): followed into the exact index."""
    kv_events_replay_port: int | None = Field(default=None, ge=1, le=65535)
    """And answers replays at this one (``replay_endpoint``, e.g. 5558)."""

    @model_validator(mode="after")
    def _port_for_a(self) -> Self:
        if self.record == "A" and self.port is None:
            raise ValueError(f"{self.name}: record A needs a port (or use record: SRV)")
        return self


class InferencePoolTarget(_Model):
    """One ``InferencePool`` (``inference.networking.k8s.io/v1``) whose pods are workers.

    Its ``spec.selector.matchLabels`` pick the pods and ``spec.targetPorts[0]`` is
    their port; a pod running, ready and with an IP is a worker, watched through
    the Kubernetes API. ``namespace`` unset: the pod's own (service account);
    ``api_server`` unset: the in-cluster one. The worker fields apply to every
    pod found. Example::

        discovery:
          inference_pools: [{name: vllm-llama3-8b, model: llama-3-8b, kv_events_port: 5557}]
    """

    name: str = Field(min_length=1)
    namespace: str | None = None
    api_server: str | None = None
    token_path: str | None = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ca_path: str | None = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    timeout_s: float = Field(default=10.0, gt=0)
    retry_s: float = Field(default=2.0, gt=0)
    """How long to wait after an API error before listing again."""
    model: str | None = None
    version: str | None = None
    api_key: str | None = Field(default=None, repr=False)
    labels: dict[str, str] = Field(default_factory=dict)
    max_in_flight: int | None = Field(default=None, ge=1)
    kv_events_port: int | None = Field(default=None, ge=1, le=65535)
    """Each pod publishes KV events on its IP at this port (vLLM's and SGLang's
    ``--kv-events-config`` endpoint, e.g. 5557): followed into the exact index."""
    kv_events_replay_port: int | None = Field(default=None, ge=1, le=65535)
    """And answers replays at this one (``replay_endpoint``, e.g. 5558)."""


class DiscoveryConfig(_Model):
    """Workers found in DNS, re-resolved every ``interval_s``.

    A worker that appears is probed and then routed to; one that disappears is
    drained (no new requests, in-flight ones finish, up to ``drain_timeout_s``).
    A failed lookup (timeout, SERVFAIL) changes nothing; a name that no longer
    exists or has no records removes its workers. ``nameservers`` (``host`` or
    ``host:port``) replace the system resolver's (``/etc/resolv.conf``).
    Static ``workers`` and those added through the admin API are never touched.
    ``inference_pools`` are watched rather than polled (``InferencePoolTarget``).
    Example::

        discovery:
          interval_s: 5
          dns:
            - {name: vllm.default.svc.cluster.local, port: 8000, model: llama-3-8b}
            - {name: _http._tcp.sglang.default.svc.cluster.local, record: SRV}
    """

    dns: list[DnsTarget] = Field(default_factory=list)
    inference_pools: list[InferencePoolTarget] = Field(default_factory=list)
    """Pods of ``InferencePool`` resources, list-and-watched (``control.kube``)."""
    interval_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=2.0, gt=0)
    nameservers: list[str] = Field(default_factory=list)

    @field_validator("nameservers")
    @classmethod
    def _host_port(cls, value: list[str]) -> list[str]:
        for server in value:
            host, port = split_host_port(server, 53)
            ipaddress.ip_address(host)  # ValueError names the bad address
            if not 0 < port < 65536:
                raise ValueError(f"bad port in {server!r}")
        return value


def split_host_port(text: str, default_port: int) -> tuple[str, int]:
    """``"10.0.0.1:53"``, ``"[::1]:53"``, ``"::1"`` or ``"10.0.0.1"`` as (host, port)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, int(port)
    return text, default_port
